"""The root helper (`tuner-helper`): the one process that writes GPU settings and owns the machine's safety state.

`schema` (the wire protocol, declared once), `peer` (who is asking, from the kernel), `leases` (one writer per
card, unconfirmed changes), `state` (the unsafe list, open trials and writes journal in /var/lib/tuner),
`user_import` (a user's own state, merged in), `service` (every request: re-check, write, journal, put back),
`kmsg` (the kernel-event stream), `server` (the socket), `cli` (the command). docs/helper.md describes it.
Imports only core, the backends and the rules it re-checks: no torch, no textual (import-linter contract).
"""
