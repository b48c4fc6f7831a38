"""Adapters: DynamoDB (PynamoDB), SQS, token files. The services see only the
small interfaces of chalicelib/service/ports.py."""
