"""Beam-search scoring: which extensions of the live beams survive a step, and which beams are returned."""

from __future__ import annotations

from jaxpaged.sequence import Request, Sequence


def beam_score(num_generated: int, cumulative_logprob: float, ends_with_eos: bool,
               length_penalty: float) -> float:
    """Length-normalised beam score: logprob / len ** penalty, len counting generated tokens but not EOS."""
    length = max(num_generated - int(ends_with_eos), 1)
    return cumulative_logprob / (length ** length_penalty)


def rank_candidates(request: Request, live: list[Sequence]) -> list[tuple[Sequence, int, float]]:
    """The `beam_width` best (beam, token, cumulative logprob) extensions of the live beams' candidates."""
    p = request.params
    eos = request.eos_token_ids
    candidates = [(seq, tok, seq.cumulative_logprob + lp)
                  for seq in live for tok, lp in seq.pending_candidates]
    candidates.sort(key=lambda c: beam_score(c[0].num_output_tokens + 1, c[2], c[1] in eos, p.length_penalty),
                    reverse=True)
    return candidates[:p.beam_width]


def best_beams(request: Request) -> list[Sequence]:
    """The request's finished beams, best first, at most `beam_width` of them."""
    p = request.params
    eos = request.eos_token_ids

    def score(s: Sequence) -> float:
        out = s.output_token_ids
        return beam_score(len(out), s.cumulative_logprob, bool(out) and out[-1] in eos, p.length_penalty)

    return sorted(request.finished_seqs, key=score, reverse=True)[:p.beam_width]
