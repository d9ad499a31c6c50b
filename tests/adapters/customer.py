"""What the simulated-user tests of every adapter share (issue 31)."""

SERVICE = "benchmax/CRM-Service-v0"  # a simulated customer answers the agent


def split_by_mask(tokenizer, ids, mask):
    """``(environment text, model text)``: the ids of each mask value decoded."""
    return (tokenizer.decode([i for i, m in zip(ids, mask) if m == 0]),
            tokenizer.decode([i for i, m in zip(ids, mask) if m == 1]))
