"""The training entry point, its loop, and the job-level span lifecycle."""
