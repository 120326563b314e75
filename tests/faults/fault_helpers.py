"""What the fault tests share: run prompts to completion and return each one's token ids."""


def run_prompts(engine, prompts, params, prefix="r") -> list[list[int]]:
    """Add every prompt with `params`, step until all finish; the first sequence's tokens, in prompt order."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{prefix}{i}", prompt, params)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update((o.request_id, o) for o in engine.step())
    return [outs[f"{prefix}{i}"].outputs[0].token_ids for i in range(len(prompts))]
