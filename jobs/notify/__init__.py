"""Hearing back: when a run finishes, one signed JSON POST to the URL it named (`notify`), retried until accepted.

urls (which URLs may be named), sign (the signature), outbox (the notifications and their attempts in the database),
send (one attempt: claim, sign, POST, record) and finished (the one place that notices a run has finished). This
package's face is empty on purpose: jobs.settings and jobs.manifest import jobs.notify.urls, which must not pull in
the database.
"""
