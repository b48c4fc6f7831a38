"""What tests of more than one folder share: waits (waits.py), the local stack
(stacks.py), stopping processes (procs.py), the CLI as a user runs it
(cli.py), real agents and job reads (agents.py), the dashboard's jobs
(browser.py) and torch jobs through the CLI (torch_jobs.py). Fixtures live in
the conftest.py files, found by pytest, never imported."""
