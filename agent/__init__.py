"""gpujobs host agent: runs the ranks that the control plane places on one node.

    python -m agent --node-id node-1 --gpus 8 --gpu-type h100 \\
        --api http://127.0.0.1:8000 --token TOKEN --state-dir /var/lib/gpujobs-agent

It registers the node (``PUT /v1/nodes/{id}``, repeated as the node heartbeat),
long-polls the node's SQS inbox for LAUNCH and CANCEL messages, runs each rank
as a local process under a small supervisor (shim.py) and reports STARTED,
EXITED and STOPPED events for attempts (API.md, "Nodes" and "Attempt events").

Modules: ``__main__`` the command line; ``runner`` the main loop; ``core`` what
is done with each message and each rank exit; ``ranks`` starting, finding and
stopping rank processes; ``shim`` the per-rank supervisor; ``state`` the local
state file; ``api`` the HTTP client; ``inbox`` SQS; ``messages`` parsing them;
``backoff`` capped exponential backoff with full jitter.

Shutting down (SIGTERM or SIGINT) stops polling and saves the state, and
**leaves the ranks running**. Restarting or upgrading the agent must not kill
hours of training: the next agent started on the same ``--state-dir`` adopts the
running ranks from the state file (it does not launch them again, can still
cancel them, and reports their exit codes, which each rank's shim records in a
file even while no agent runs). To stop the ranks as well, cancel their jobs
through the API. Reports not yet sent are kept in the state file and sent after
the restart. Stopping takes up to ``--poll-wait-s`` seconds: a long poll still
open is let return, so the messages it brings are handed back to the queue at
once rather than after their visibility timeout.

This package imports nothing outside the standard library at import time (boto3
only when the SQS inbox is created), so the shim and the tests start quickly.
"""
