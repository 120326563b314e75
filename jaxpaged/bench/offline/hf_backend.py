"""The Hugging Face transformers side of the offline throughput benchmark (torch on the CPU).

What a user without a GPU would run instead of jaxpaged: `model.generate` over
one static batch per `batch_size` prompts, left-padded with an attention mask,
as vLLM's `benchmark_throughput --backend=hf` does. torch and transformers come
from the optional `hf` extra and are imported only when this backend runs;
`require_hf` turns their absence into one line naming the extra.
"""

from __future__ import annotations

from collections.abc import Sequence

MISSING_EXTRA = "the hf backend needs torch and transformers: pip install -e '.[hf]'"


class HFBackendMissing(RuntimeError):
    """torch or transformers cannot be imported (the `hf` extra is not installed)."""


def require_hf():
    """`(torch, transformers)`, or `HFBackendMissing` with the one-line install hint."""
    try:
        import torch
        import transformers
    except ImportError as err:
        raise HFBackendMissing(f"{MISSING_EXTRA} ({err})") from None
    return torch, transformers


def load_hf_model(checkpoint_dir: str, *, num_threads: int | None):
    """The checkpoint as a float32 `LlamaForCausalLM` in eval mode; torch limited to `num_threads`."""
    torch, transformers = require_hf()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch.float32)
    model.eval()
    # ignore_eos: generation never stops early, so every prompt gets exactly max_new_tokens
    model.generation_config.eos_token_id = None
    return model


def generate(model, prompts: Sequence[Sequence[int]], *, output_len: int, batch_size: int,
             temperature: float = 0.0, seed: int = 0) -> list[list[int]]:
    """`output_len` new tokens for each prompt, `batch_size` prompts per left-padded static batch.

    `temperature=0` is greedy (`do_sample=False`); otherwise plain sampling at
    that temperature with top-k and top-p off, seeded by `seed`.
    """
    torch, _ = require_hf()
    if temperature > 0:
        torch.manual_seed(seed)
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    else:
        sampling = {"do_sample": False}
    outputs = []
    for start in range(0, len(prompts), batch_size):
        input_ids, mask = _left_padded(torch, prompts[start:start + batch_size])
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=output_len,
                                 min_new_tokens=output_len, pad_token_id=0, use_cache=True, **sampling)
        new = out[:, input_ids.shape[1]:].tolist()
        if any(len(ids) != output_len for ids in new):
            raise RuntimeError(f"transformers returned {[len(i) for i in new]} tokens, wanted {output_len} each")
        outputs.extend(new)
    return outputs


def _left_padded(torch, prompts: Sequence[Sequence[int]]):
    """`(input_ids, attention_mask)` int64 tensors, shorter prompts padded on the left with id 0."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids, mask
