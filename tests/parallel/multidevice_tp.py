"""Tensor-parallel checks on 8 forced host devices; run by `test_tensor_parallel.py` in one subprocess.

Not collected on its own (no `test_` prefix): the rest of the suite runs on
one CPU device, and XLA's device count is fixed when JAX starts.

Every check compares N devices with N = 1: logits within float tolerance,
greedy and seeded tokens equal through prefix hits, preemption and n > 1;
each device holds 1/N of the pool (1/kv_heads when KV heads are replicated);
compiles stay as many as on one device; the pool is still donated and keeps
its split; host block copies and fp8 scales stay in logical KV heads; the
Pallas kernel works on local heads; checkpoints load straight into shards;
GGUF files too; the Qwen2 (biases), Qwen3 (q/k norms) and Gemma 3 (sliding + full layers)
families give the same logits sharded as on one device; so does the pretrained SmolLM2 at N = 3 (its greedy
tokens too).
"""

import jax
import numpy as np
import pytest

from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner
from jaxpaged.runner.step_input import ScheduledSeq, build_step_input
from jaxpaged.sampling_params import SamplingParams

BS = 4
SHARED = list(range(40, 61))  # 5 full blocks shared by half the prompts
TINY = load_config("tiny")  # 4 query heads, 2 KV heads: N = 4 replicates each KV head twice
TINY8 = TINY.replace(name="tiny8", num_heads=8, num_kv_heads=2, head_dim=8)  # N = 8: four copies
CASES = [(TINY, 2), (TINY, 4), (TINY8, 8)]
# The whole engine (17 compiles) runs at N = 2 and 4; N = 8 checks the runner's logits, blocks and shards,
# which is where four copies of a KV head differ from two (the engine above the runner is the same code).
ENGINE_CASES = CASES[:2]


def test_eight_host_devices():
    assert len(jax.devices()) == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"


@pytest.fixture(scope="module")
def models():
    return {TINY.name: init_model(TINY, seed=0), TINY8.name: init_model(TINY8, seed=3)}


def _workload(vocab):
    """Greedy and seeded requests, n = 3 forks, a shared prefix; enough of them to preempt in 40 blocks."""
    rng = np.random.default_rng(11)
    requests = []
    for i in range(10):
        tail = rng.integers(0, vocab - 20, int(rng.integers(2, 15))).tolist()
        prompt = SHARED + tail if i % 2 == 0 else tail
        if i % 4 == 3:
            params = SamplingParams(n=3, temperature=0.9, seed=100 + i, max_tokens=10, ignore_eos=True)
        elif i % 3 == 1:
            params = SamplingParams(temperature=1.0, top_k=20, seed=i, max_tokens=14, ignore_eos=True)
        else:
            params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        requests.append((f"r{i}", prompt, params))
    return requests


def _run(model, n, num_blocks=40):
    engine = Engine(EngineConfig(model="tiny", block_size=BS, num_blocks=num_blocks, max_num_seqs=16,
                                 pool_fill_value=float("nan"), tensor_parallel_size=n), model=model)
    for rid, prompt, params in _workload(model.config.vocab_size):
        engine.add_request(rid, prompt, params)
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = [c.token_ids for c in out.outputs]
    assert engine.kv.stats.num_free_blocks == engine.num_blocks  # nothing leaks
    return engine, finals


@pytest.fixture(scope="module")
def single_device(models):
    return {TINY.name: _run(models[TINY.name], 1)}


@pytest.mark.parametrize("config,n", ENGINE_CASES, ids=lambda c: getattr(c, "name", c))
def test_engine_tokens_equal_single_device(models, single_device, config, n):
    ref_engine, ref_tokens = single_device[config.name]
    assert ref_engine.scheduler.num_preemptions > 0 and ref_engine.kv.stats.prefix_hits_tokens > 0
    engine, tokens = _run(models[config.name], n)
    assert tokens == ref_tokens
    assert engine.scheduler.num_preemptions == ref_engine.scheduler.num_preemptions
    assert engine.runner.num_compiles == ref_engine.runner.num_compiles  # same buckets, same compiles
    pages = engine.runner.pool.k[0]
    total = ref_engine.runner.pool.k[0].nbytes  # the whole logical pool of one layer
    share = total // min(n, config.num_kv_heads)  # 1/N, or one KV head's worth when heads are replicated
    assert engine.stats.num_steps and engine.kv.stats.num_cow_copies > 0  # forks copied blocks on write
    assert all(a.sharding == engine.runner.tp.pool_pages for a in engine.runner.pool.k + engine.runner.pool.v)
    shards = pages.addressable_shards
    assert len({s.device for s in shards}) == n
    assert all(s.data.nbytes == share for s in shards)


def _steps():
    first = [ScheduledSeq(list(range(1, 12)), 0, [3, 7, 1]), ScheduledSeq(list(range(30, 37)), 0, [5, 2])]
    second = [ScheduledSeq([12], 11, [3, 7, 1]), ScheduledSeq([37, 38, 39], 7, [5, 2, 9])]
    return [build_step_input(first, BS), build_step_input(second, BS)]


@pytest.mark.parametrize("config,n", CASES, ids=lambda c: getattr(c, "name", c))
def test_logits_and_blocks_match_single_device(models, config, n):
    runners = [ModelRunner(models[config.name], 16, BS, tensor_parallel_size=k) for k in (1, n)]
    for step in _steps():
        ref, got = (r.execute(step, return_logits=True) for r in runners)
        np.testing.assert_allclose(got.logits, ref.logits, atol=2e-5, rtol=1e-5)
        np.testing.assert_array_equal(got.token_ids, ref.token_ids)
    # host block copies speak logical KV heads at any N (tiers, snapshots)
    ref_blocks, blocks = (r.read_blocks([3, 7, 9]) for r in runners)
    assert blocks[0].shape == (2, config.num_layers, config.num_kv_heads, BS, config.head_dim)
    np.testing.assert_allclose(np.stack(blocks), np.stack(ref_blocks), atol=2e-5)
    runners[1].write_blocks([0], [ref_blocks[0] + 1.0])
    np.testing.assert_allclose(runners[1].read_blocks([0])[0], ref_blocks[0] + 1.0, atol=2e-5)
    assert all(a.sharding == runners[1].tp.pool_pages for a in runners[1].pool.k)  # the scatter kept the split
    shards = runners[1].pool.k[0].addressable_shards  # 1/N of the pool, or one KV head's worth when replicated
    assert len({s.device for s in shards}) == n
    assert all(s.data.nbytes == runners[0].pool.k[0].nbytes // min(n, config.num_kv_heads) for s in shards)


def test_pool_donated_and_not_copied(models):
    runner = ModelRunner(models[TINY.name], 64, BS, tensor_parallel_size=4)
    before = runner.pool
    step = build_step_input([ScheduledSeq([7], 5, [2, 3])], BS)
    runner.execute(step)
    assert all(a.is_deleted() for a in before.k + before.v)
    hlo = runner.lower(step).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]
    local_pages = f"[1,64,{BS},{TINY.head_dim}]"  # one KV head per device
    assert local_pages in entry
    assert [line for line in entry.splitlines() if " copy(" in line and local_pages in line.split("=")[1][:40]] == []
    assert "all-reduce" in hlo  # row-split projections are summed across devices
    assert not [line for line in hlo.splitlines() if "all-gather" in line and local_pages in line]


def test_sharded_random_weights_equal_unsharded():
    """`LLM(model=name, tensor_parallel_size=N)` draws each shard on its device: the same weights."""
    from jaxpaged.checkpoint import load_model
    from jaxpaged.checkpoint.skeleton import model_params
    sharded = model_params(load_model("tiny", seed=0, tensor_parallel_size=4))
    plain = model_params(init_model(TINY, seed=0))
    for path, value in plain.items():
        np.testing.assert_array_equal(np.asarray(sharded[path]), np.asarray(value), err_msg=str(path))
    assert sharded[("layers", 0, "mlp", "up_proj", "kernel")].addressable_shards[0].data.shape == (64, 32)


def test_pallas_kernel_sees_local_heads(models):
    """The Pallas kernel (interpreted on CPU) under shard_map at N = 2 matches the one-device reference."""
    from jaxpaged.attention import resolve_backend
    step = _steps()[0]
    ref = ModelRunner(models[TINY.name], 16, BS).execute(step, return_logits=True)
    pallas = resolve_backend("pallas", interpret=True)
    got = ModelRunner(models[TINY.name], 16, BS, backend=pallas, tensor_parallel_size=2).execute(
        step, return_logits=True)
    np.testing.assert_allclose(got.logits, ref.logits, atol=2e-5, rtol=1e-5)


def test_mosaic_kernel_sees_local_heads(monkeypatch):
    """The Mosaic GPU kernel (GPU interpret mode) under shard_map at N = 2 matches the one-device XLA path.

    The interpreter checks, as each kernel ends, that no barrier is left allocated,
    but over all simulated devices at once: with two devices' kernels running
    concurrently that check sees the other device's live barriers and fails at
    random (JAX 0.11.2 and 0.12). It is switched off here only; the logits still
    hold the kernel to the reference, and the single-device tests keep the check.
    The race detector is off here too: with two devices' kernels interleaved it
    once reported a TMA-write / shared-memory-read pair within one device that
    the same step on one device, race-checked, never shows (tests/kernels/
    test_mosaic_backend.py runs the runner's steps on one device with it on).
    """
    from jaxpaged.attention import resolve_backend
    from jaxpaged.attention.backend import mosaic_gpu_available
    if not mosaic_gpu_available():
        pytest.skip("this JAX has no Mosaic GPU backend")
    try:
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
        monkeypatch.setattr(gpu_callbacks, "call_assert_no_barriers_allocated", lambda token: token)
        from pallas_kernels import ragged_paged_attention_mgpu as mgpu
        no_races = mgpu.interpret_params(detect_races=False)
        monkeypatch.setattr(mgpu, "interpret_params", lambda detect_races=True: no_races)
    except (ImportError, AttributeError) as error:
        pytest.skip(f"private interpreter hook moved: {error}")
    model = init_model(TINY.replace(name="tiny-d64", head_dim=64, num_layers=1, dtype="bfloat16"), seed=0)
    step = _steps()[0]
    ref = ModelRunner(model, 16, BS).execute(step, return_logits=True)
    mosaic = resolve_backend("pallas_mosaic", interpret=True)
    got = ModelRunner(model, 16, BS, backend=mosaic, tensor_parallel_size=2).execute(step, return_logits=True)
    np.testing.assert_allclose(got.logits, ref.logits, atol=5e-2, rtol=5e-2)
    np.testing.assert_array_equal(got.token_ids, ref.token_ids)


def test_fp8_pool_with_replicated_heads(models):
    """fp8 at N = 4 (KV heads replicated): calibrated scales and tokens as on one device."""
    runs = {}
    for n in (1, 4):
        engine = Engine(EngineConfig(model="tiny", block_size=BS, num_blocks=32, kv_cache_dtype="fp8_e4m3",
                                     tensor_parallel_size=n), model=models[TINY.name])
        engine.add_request("a", list(range(1, 30)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        engine.add_request("b", list(range(50, 61)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        tokens = {}
        while engine.has_unfinished_requests():
            tokens.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
        runs[n] = (engine.runner.kv_scales(), tokens)
    (ref_scales, ref_tokens), (scales, tokens) = runs[1], runs[4]
    assert scales[0].shape == (TINY.num_layers, TINY.num_kv_heads)
    for a, b in zip(scales, ref_scales):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    assert tokens == ref_tokens


def test_pretrained_smollm2_at_three_devices_gives_the_same_tokens():
    """The real SmolLM2-135M (`make model`) loaded straight into 3 shards: a prompt's prefill and 8 greedy decode
    steps give one device's tokens, logits within float tolerance. Its 9 query and 3 KV heads do not split over
    2 devices; 3 is its smallest split."""
    from jaxpaged.checkpoint import load_model, model_config
    from jaxpaged.pretrained import default_model_path
    from jaxpaged.tokenizer import load_tokenizer
    path = default_model_path()
    prompt = load_tokenizer(path, model_config(path)).encode("The three primary colors are red, yellow and")
    table = list(range(4))  # 4 blocks of 32 tokens hold the prompt and the 8 tokens after it
    runners = [ModelRunner(load_model(path, dtype="float32", tensor_parallel_size=n), 8, 32,
                           tensor_parallel_size=n) for n in (1, 3)]
    tokens = {}
    for n, runner in zip((1, 3), runners):
        step, out, logits = build_step_input([ScheduledSeq(prompt, 0, table)], 32), [], []
        for i in range(9):
            result = runner.execute(step, return_logits=True)
            out.append(int(result.token_ids[0]))
            logits.append(np.asarray(result.logits[0]))
            step = build_step_input([ScheduledSeq([out[-1]], len(prompt) + i, table)], 32)
        tokens[n] = (out, np.stack(logits))
    (ref, ref_logits), (got, got_logits) = tokens[1], tokens[3]
    assert got == ref
    np.testing.assert_allclose(got_logits, ref_logits, atol=2e-3, rtol=1e-4)
    assert {s.data.shape for s in runners[1].pool.k[0].addressable_shards} == {(1, 8, 32, 64)}  # a KV head each


def _save_gguf(model, path):
    """`model` as a float32 GGUF file, through its HF checkpoint (llama.cpp's names and q/k permutation)."""
    import json

    from safetensors.numpy import load_file

    from jaxpaged.checkpoint import save_hf_checkpoint
    from tests.checkpoint.gguf_files import write_gguf
    save_hf_checkpoint(model, path.parent / "hf-for-gguf")
    hf = json.loads((path.parent / "hf-for-gguf" / "config.json").read_text())
    write_gguf(path, hf, load_file(path.parent / "hf-for-gguf" / "model.safetensors"))


@pytest.mark.parametrize("fmt,n", [("hf", 4), ("orbax", 2), ("gguf", 2)])
def test_checkpoints_load_into_shards(models, tmp_path, fmt, n):
    """A checkpoint loaded at N devices: each weight arrives as its slices, and the model computes the same."""
    from jaxpaged.checkpoint import load_model, save_hf_checkpoint, save_params
    from jaxpaged.checkpoint.skeleton import model_params
    model = models[TINY.name]
    {"hf": save_hf_checkpoint, "orbax": save_params, "gguf": _save_gguf}[fmt](model, tmp_path / fmt)
    loaded = model_params(load_model(tmp_path / fmt, tensor_parallel_size=n))
    for path, value in model_params(model).items():
        np.testing.assert_array_equal(np.asarray(loaded[path]), np.asarray(value), err_msg=str(path))
    up = loaded[("layers", 0, "mlp", "up_proj", "kernel")]
    assert {s.data.shape for s in up.addressable_shards} == {(TINY.hidden_size, TINY.intermediate_size // n)}
    step = _steps()[0]
    ref = ModelRunner(model, 16, BS).execute(step, return_logits=True)
    got = ModelRunner(load_model(tmp_path / fmt, tensor_parallel_size=n), 16, BS,
                      tensor_parallel_size=n).execute(step, return_logits=True)
    np.testing.assert_allclose(got.logits, ref.logits, atol=2e-5, rtol=1e-5)


FAMILY_CASES = [("tiny-qwen3", 2), ("tiny-gemma3", 4), ("tiny-qwen2", 4)]


def _long_steps():
    """A 45-token prompt chunked past the tiny families' window of 32, beside a short prompt and its decode."""
    a, b = list(range(3, 48)), list(range(100, 109))
    table_a, table_b = list(range(20, 32)), [5, 2, 9]
    return [build_step_input([ScheduledSeq(a[:30], 0, table_a), ScheduledSeq(b, 0, table_b)], BS),
            build_step_input([ScheduledSeq(a[30:], 30, table_a), ScheduledSeq([7], 9, table_b)], BS)]


@pytest.mark.parametrize("name,n", FAMILY_CASES)
def test_family_logits_match_single_device(tmp_path, name, n):
    """Qwen3 (q/k norms), Gemma 3 (sliding + full layers, sandwich norms, its softmax scale) and Qwen2
    (q/k/v biases, widened with the KV heads at N = 4), loaded from a HF checkpoint straight into shards."""
    from jaxpaged.checkpoint import load_model, save_hf_checkpoint
    model = init_model(load_config(name), seed=4)
    save_hf_checkpoint(model, tmp_path / "hf")
    sharded = load_model(tmp_path / "hf", tensor_parallel_size=n)
    runners = [ModelRunner(model, 32, BS), ModelRunner(sharded, 32, BS, tensor_parallel_size=n)]
    for step in _long_steps():
        ref, got = (r.execute(step, return_logits=True) for r in runners)
        np.testing.assert_allclose(got.logits, ref.logits, atol=2e-5, rtol=1e-5)
        np.testing.assert_array_equal(got.token_ids, ref.token_ids)


def test_prompt_logprobs_at_two_devices_equal_the_dense_forward(models):
    import jax.numpy as jnp
    from tests.paged_driver import dense_logits
    model = models[TINY.name]
    prompt = list(range(40, 60))  # 20 tokens: three 8-token chunks
    engine = Engine(EngineConfig(model="tiny", block_size=BS, num_blocks=40, max_num_batched_tokens=8,
                                 tensor_parallel_size=2), model=model)
    engine.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2))
    final = None
    while engine.has_unfinished_requests():
        final = next((o for o in engine.step() if o.finished), final)
    ref = np.asarray(jax.nn.log_softmax(jnp.asarray(dense_logits(model, prompt)), axis=-1))
    for i in range(1, len(prompt)):
        entry = final.prompt_logprobs[i]
        assert entry[prompt[i]] == pytest.approx(ref[i - 1, prompt[i]], abs=1e-4)
        assert set(np.argsort(-ref[i - 1])[:2].tolist()) <= set(entry)


def test_structured_output_at_two_devices_equals_one_device(models):
    """Grammar rows take the split step (forward, then masked sampling) under tensor parallelism too."""
    import json

    import jsonschema

    from jaxpaged.structured import StructuredOutputsParams
    from tests.structured.structured_cases import SCHEMAS
    schemas = SCHEMAS[19:23]
    texts = []
    for n in (1, 2):
        engine = Engine(EngineConfig(model="tiny", block_size=BS, num_blocks=80, tensor_parallel_size=n),
                        model=models[TINY.name])
        for i, schema in enumerate(schemas):
            engine.add_request(str(i), [5, 6, 7, i], SamplingParams(
                temperature=float(i % 2), seed=i, max_tokens=64,
                structured_outputs=StructuredOutputsParams(json=schema, disable_any_whitespace=True)))
        finals = {}
        while engine.has_unfinished_requests():
            finals.update({o.request_id: o.outputs[0].text for o in engine.step() if o.finished})
        texts.append(finals)
    assert texts[0] == texts[1]
    for i, schema in enumerate(schemas):
        jsonschema.validate(json.loads(texts[1][str(i)]), schema)
