"""The OpenAPI description is the contract, tested by schemathesis against the real server on loopback.

schemathesis reads the server's own /openapi.json and draws requests from it with Hypothesis: for every route,
requests the description allows (positive) and requests it does not (negative), each route once with run names drawn
at random (404s, ids past 2^63) and once naming a run of the caller's own. Every answer is checked against the
description: no 5xx, a status the route lists, the declared content type and headers (Retry-After on 429), and a body
that matches the status's schema. One check is left out, positive_data_acceptance (that a schema-valid request is
answered 2xx): a manifest is text whose rules no JSON schema states (an empty string is valid text and a 422 with its
FILE:LINE problems), so schema-valid is not acceptable here.

Why schemathesis: it is the property-based OpenAPI tester that reads OpenAPI 3.1 as FastAPI writes it, draws bodies
for each declared media type (YAML and JSONL as text, multipart), and checks responses against the schema it read,
so the test holds the description to what the server does without a hand-kept copy of either.
"""

from __future__ import annotations

import schemathesis

from tests.jobs.service_server import Service, embedded_env

EXAMPLES = 25  # per route, mode and kind of run name: about 1,200 requests in all

MINE = "name: mine\nmodel: tiny\ndefaults: {steps: 2}\nvideos:\n  - {id: a, prompt: one}\n"


def test_every_answer_is_one_the_description_declares(tmp_path, model_cache):
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    svc = Service(tmp_path, embedded_env(model_cache), "--submits-per-minute", "100000",
                  "--estimates-per-minute", "100000", "--changes-per-minute", "100000")
    try:
        token = svc.team("fuzz")
        client = svc.client(token)
        assert client.post("/v1/runs", content=MINE, headers={"content-type": "application/yaml"}).status_code == 201
        described = client.get("/openapi.json").json()
        # With the token sent on every request: the description without its security scheme, so that a negative
        # draw never counts a missing Authorization header (sent anyway) as the invalid part of its request.
        open_door = {**described, "paths": {path: {method: {k: v for k, v in op.items() if k != "security"}
                                                   for method, op in item.items()}
                                            for path, item in described["paths"].items()}}
        schema = schemathesis.openapi.from_dict(open_door)
        auth = {"Authorization": f"Bearer {token}"}
        seen: dict[str, set[int]] = {}
        failures = []
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) == 13
        for operation in operations:
            named = ({}, {"run": "mine"}) if "{run}" in operation.path else ({},)
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                for path_parameters in named:
                    strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters or None)

                    @given(case=strategy)
                    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                              suppress_health_check=list(HealthCheck))
                    def check(case):
                        response = case.call(base_url=svc.url, headers=auth, timeout=60)
                        seen.setdefault(f"{operation.method.upper()} {operation.path}", set()).add(
                            response.status_code)
                        try:
                            case.validate_response(
                                response, excluded_checks=[schemathesis.checks.positive_data_acceptance])
                        except BaseException as exc:  # noqa: BLE001 - schemathesis raises a group of failures
                            failures.append(f"{case.method} {case.formatted_path}: {exc}"[:2000])

                    try:
                        check()
                    except Unsatisfiable:  # a negative draw with nothing to make invalid (no parameter, or a fixed run)
                        assert mode is GenerationMode.NEGATIVE, operation.path
        # Without a token, as described (its bearer scheme): every route is a 401 in the declared shape.
        for operation in (result.ok() for result in schemathesis.openapi.from_dict(described).get_all_operations()):

            @given(case=operation.as_strategy())
            @settings(max_examples=5, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def refused(case):
                response = case.call(base_url=svc.url, timeout=60)
                assert response.status_code == 401, (case.method, case.formatted_path, response.text)
                try:
                    case.validate_response(response, excluded_checks=[schemathesis.checks.positive_data_acceptance])
                except BaseException as exc:  # noqa: BLE001
                    failures.append(f"{case.method} {case.formatted_path} (no token): {exc}"[:2000])

            refused()
        assert failures == [], "\n\n".join(failures[:5])
        assert all(code < 500 for codes in seen.values() for code in codes), seen
        # The draws reached past the door: a run of its own answered 200 on its status, and bad input 4xx.
        assert 200 in seen["GET /v1/runs/{run}"] and 404 in seen["GET /v1/runs/{run}"]
        assert 422 in seen["POST /v1/runs"] or 415 in seen["POST /v1/runs"]
    finally:
        svc.stop()
