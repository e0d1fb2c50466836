"""envace.evaluation: success rates on held-out tasks, test-time rehearsal evaluation and the
endpoint probe's model side."""
