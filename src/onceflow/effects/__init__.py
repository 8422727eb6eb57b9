"""Side effects on external services: the demo service, the ledger and the HTTP sink."""
