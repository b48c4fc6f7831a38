"""The service layer: use cases over the ports; no HTTP, no boto3."""
