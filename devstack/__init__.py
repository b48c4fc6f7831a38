"""The local stack: moto server, resources from infra/, the Chalice app over
HTTP, timers for the scheduled functions, simulated agents."""
