"""Hearing back: when a run finishes, one signed JSON POST to the URL it named (`notify`), retried until accepted.

sign (the signature), outbox (the notifications and their attempts in the database), send (one attempt: claim, sign,
POST, record) and finished (the one place that notices a run has finished). Which URLs a run may name is the
manifest's check (jobs.manifest.urls), made before anything is written.
"""
