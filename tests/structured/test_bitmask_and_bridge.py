"""Token bitmasks (packing, the jitted apply) and the llguidance tokenizer bridge, without a model.

The bridge is checked end to end on every tokenizer family: a random walk that
samples only tokens the mask allows, decoded by the project's own tokenizer,
must give text that parses and validates against the schema (jsonschema).
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from tokenizers import Tokenizer as HFTok
from tokenizers import decoders, models, pre_tokenizers, trainers

from jaxpaged.structured import StructuredOutputsParams
from jaxpaged.structured.bitmask import apply_token_bitmask, fill_bitmasks, pad_token_masks, unpack_bitmask
from jaxpaged.structured.grammar import bitmask_width, compile_constraint, pack_token_ids
from jaxpaged.structured.tokenizer_bridge import ll_tokenizer
from jaxpaged.tokenizer import ByteTokenizer, HFTokenizer, IdsOnlyTokenizer, SentencePieceTokenizer

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bc"]},
                                                    "maxItems": 3}},
          "required": ["name", "n", "tags"], "additionalProperties": False}


def test_pack_token_ids_matches_llguidance_layout():
    llguidance_numpy = pytest.importorskip("llguidance.numpy")
    ids = [0, 5, 31, 32, 63, 64, 270]
    row = pack_token_ids(ids, 272)
    assert row.shape == (bitmask_width(272),) == (9,)
    assert np.flatnonzero(unpack_bitmask(row, 272)).tolist() == ids
    logits = np.zeros((1, 272), np.float32)
    llguidance_numpy.apply_token_bitmask_inplace(logits, row[None])  # llguidance's own reference
    assert np.flatnonzero(np.isfinite(logits[0])).tolist() == ids


def test_apply_token_bitmask_touches_only_masked_rows():
    rng = np.random.default_rng(0)
    vocab, rows = 100, 6
    logits = rng.normal(size=(rows, vocab)).astype(np.float32)
    allowed = rng.random((2, vocab)) < 0.3
    bits = np.stack([pack_token_ids(np.flatnonzero(a), vocab) for a in allowed])
    masks = pad_token_masks(np.array([4, 1]), bits)  # padded to 2 rows; a third would be dropped
    out = np.asarray(apply_token_bitmask(jnp.asarray(logits), masks))
    expected = logits.copy()
    expected[4][~allowed[0]] = -np.inf
    expected[1][~allowed[1]] = -np.inf
    np.testing.assert_array_equal(out, expected)
    padded = pad_token_masks(np.array([2, 3, 5]), np.stack([bits[0], bits[1], bits[0]]))
    assert padded.rows.shape == (4,) and (np.asarray(padded.bits[3]) == -1).all()
    out = np.asarray(apply_token_bitmask(jnp.asarray(logits), padded))
    np.testing.assert_array_equal(out[0], logits[0])  # the padding row (dropped) changed nothing


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    tok = HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(['{"name": "bob", "n": 12, "tags": ["a", "bc"]}', "hello world"] * 4, trainer)
    path = tmp_path_factory.mktemp("hf")
    tok.save(str(path / "tokenizer.json"))
    (path / "config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    return HFTokenizer.from_dir(path)


@pytest.fixture(scope="module")
def sp_tokenizer(tmp_path_factory):
    sentencepiece = pytest.importorskip("sentencepiece")
    path = tmp_path_factory.mktemp("sp")
    corpus = path / "corpus.txt"
    corpus.write_text('{"name": "ann", "n": 7, "tags": ["bc"]}\nthe quick brown fox\n' * 20)
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(path / "tokenizer"),
                                             vocab_size=320, model_type="bpe", bos_id=1, eos_id=2, unk_id=0,
                                             pad_id=-1, byte_fallback=True, minloglevel=2)
    return SentencePieceTokenizer.from_dir(path)


def _random_walk(constraint, tokenizer, vocab: int, rng, max_steps: int = 300) -> tuple[list[int], bool]:
    """Sample uniformly among allowed tokens until EOS; returns (tokens before EOS, ended with EOS)."""
    out = []
    for _ in range(max_steps):
        row = np.zeros(constraint.width, np.int32)
        constraint.fill_bitmask(row)
        allowed = np.flatnonzero(unpack_bitmask(row, vocab))
        assert allowed.size, "the mask allows nothing"
        token = int(rng.choice(allowed))
        if token in tokenizer.stop_token_ids:
            return out, True
        assert constraint.accept(token)
        out.append(token)
    return out, False


@pytest.mark.parametrize("family", ["bytes", "hf", "sentencepiece"])
def test_random_walks_under_the_mask_validate(family, hf_tokenizer, sp_tokenizer):
    tokenizer = {"bytes": ByteTokenizer(), "hf": hf_tokenizer, "sentencepiece": sp_tokenizer}[family]
    vocab = tokenizer.vocab_size + 5  # a model's padded embedding rows are never allowed
    rng = np.random.default_rng(1)
    params = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    for _ in range(5):
        constraint = compile_constraint(params, None, tokenizer, vocab)
        tokens, ended = _random_walk(constraint, tokenizer, vocab, rng)
        assert ended
        assert all(t < tokenizer.vocab_size for t in tokens)
        jsonschema.validate(json.loads(tokenizer.decode(tokens)), SCHEMA)


def test_bridge_is_built_once_per_tokenizer_and_vocabulary():
    tokenizer = ByteTokenizer()
    assert ll_tokenizer(tokenizer, 272) is ll_tokenizer(tokenizer, 272)
    assert ll_tokenizer(tokenizer, 288) is not ll_tokenizer(tokenizer, 272)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        ll_tokenizer(IdsOnlyTokenizer(1, 2, 100), 100)
    with pytest.raises(ValueError, match=r"vocabulary \(300 ids\) to fit the model's \(272 logits\)"):
        ll_tokenizer(ByteTokenizer(vocab_size=300), 272)


def test_fill_bitmasks_combines_grammar_and_allowed_ids():
    tokenizer = ByteTokenizer()
    choice = compile_constraint(StructuredOutputsParams(choice=["ab", "cd"]), None, tokenizer, 272)
    both = compile_constraint(StructuredOutputsParams(choice=["ab", "cd"]), [ord("c"), ord("x")], tokenizer, 272)
    only = compile_constraint(None, [3, 4], tokenizer, 272)
    masks = fill_bitmasks([choice, both, only], bitmask_width(272))
    assert [np.flatnonzero(unpack_bitmask(m, 272)).tolist() for m in masks] == [[ord("a"), ord("c")],
                                                                                 [ord("c")], [3, 4]]
    fork = choice.fork()
    assert fork.accept(ord("a")) and not choice.accept(ord("x"))  # independent states; x is refused
    assert fork.accept(ord("b")) and fork.is_terminated
    fork.rollback(1)
    assert not fork.is_terminated and fork.accept(ord("b"))


@pytest.mark.parametrize("params, field, message", [
    (dict(regex="[a-"), "regex", "unclosed character class"),
    (dict(json={"type": "frobnicate"}), "json", "frobnicate"),
    (dict(grammar="start: undefined_rule"), "grammar", "undefined_rule"),
])
def test_constraints_that_do_not_compile_name_the_problem(params, field, message):
    with pytest.raises(ValueError, match=rf"structured_outputs\.{field} does not compile: .*{message}"):
        compile_constraint(StructuredOutputsParams(**params), None, ByteTokenizer(), 272)


@pytest.mark.parametrize("kwargs, message", [
    (dict(), "exactly one of"),
    (dict(regex="a", choice=["a"]), "exactly one of"),
    (dict(json="{not json"), "not valid JSON"),
    (dict(json=[1]), "must be a JSON schema object"),
    (dict(choice=[]), "at least one"),
    (dict(choice="ab"), "list of strings"),
    (dict(regex=""), "non-empty string"),
    (dict(json_object=False), "exactly one of"),
])
def test_structured_outputs_params_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**kwargs)


def test_allowed_token_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match=r"allowed_token_ids entry 300 is outside the vocabulary \[0, 272\)"):
        compile_constraint(None, [1, 300], ByteTokenizer(), 272)
