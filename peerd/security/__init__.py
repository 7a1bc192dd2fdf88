"""Security: the job secret's proofs, mutual TLS, refusals and what a worker is handed."""
