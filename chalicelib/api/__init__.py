"""The HTTP edge: the error boundary and request helpers (edge.py), the code ->
status table (problems.py), SQS batches (batch.py), request validation, JSON
Schemas and representations."""
