"""Every `jaxpaged` command parses its flags in-process and refuses a bad value with one line naming the flag."""

import pytest

from jaxpaged.cli import main as cli
from jaxpaged.cli.commands import COMMANDS

BAD = [
    ("bench ablate", "--block_sizes=16,0", "block_sizes"),
    ("bench ablate", "--model=no-such-model", "model"),
    ("bench attention", "--block_size=0", "block_size"),
    ("bench block-manager", "--hash_algo=md5", "hash_algo"),
    ("bench host-overhead", "--num_seqs=64,x", "num_seqs"),
    ("bench offload", "--parts=bogus", "parts"),
    ("bench serving", "--block_size=0", "block_size"),
    ("bench serving", "--request_rate=-1", "request_rate"),
    ("bench serving", "--modes=prefix_on,fast", "modes"),
    ("bench serving", "--burstiness=0", "burstiness"),
    ("bench serving", "--max_concurrency=0", "max_concurrency"),
    ("bench serving", "--dataset_name=sharegpt4", "dataset_name"),
    ("bench serving", "--eviction_policy=fifo", "eviction_policy"),
    ("bench serving", "--kv_cache_metrics_sample=2", "kv_cache_metrics_sample"),
    ("bench http-overhead", "--repeats=0", "repeats"),
    ("bench step", "--repeats=0", "repeats"),
    ("bench startup", "--repeats=0", "repeats"),
    ("bench cpu-efficiency", "--prefill_lens=512,0", "prefill_lens"),
    ("bench throughput", "--num_prompts=0", "num_prompts"),
    ("bench throughput", "--max_num_seqs=0", "max_num_seqs"),
    ("bench latency", "--batch_size=0", "batch_size"),
    ("calibrate", "--num_blocks=-3", "num_blocks"),
    ("convert", "--dtype=int4", "dtype"),
    ("capacity", "--budget_gb=nan", "budget_gb"),
    ("capacity", "--kv_dtype=int3", "kv_dtype"),
    ("bench profile", "--block_size=0", "block_size"),
    ("simulate serving", "--profile=tpu-v9", "profile"),
    ("simulate serving", "--scales=output_len", "scales"),
    ("simulate routing", "--policies=prefix_aware,random", "policies"),
    ("simulate routing", "--replicas=8,0", "replicas"),
    ("serve", "--port=0", "port"),
    ("serve", "--kv_role=middle", "kv_role"),
    ("proxy", "--port=0", "port"),
    ("bench disagg", "--transports=zmq,rdma", "transports"),
    ("serve", "--kv_cache_dtype=int4", "kv_cache_dtype"),
    ("serve", "--data_parallel_size=0", "data_parallel_size"),
    ("serve", "--device_profile=tpu-v9", "device_profile"),
    ("serve", "--max_request_body_bytes=0", "max_request_body_bytes"),
    ("serve", "--save_prefix_cache_on_shutdown", "save_prefix_cache_on_shutdown"),
    ("serve", "--chat_template=no/such/template.jinja", "chat_template"),
    ("bench prompt-stall", "--repeats=0", "repeats"),
    ("bench replicas", "--replicas=2,0", "replicas"),
    ("bench replicas", "--policies=prefix_aware,random", "policies"),
    ("bench tensor-parallel", "--sizes=1,0", "sizes"),
    ("bench replay-cache", "--trace=no/such/trace.jsonl", "trace"),
    ("check-dashboard", "--traffic_s=0", "traffic_s"),
    ("lm-eval", "--num_concurrent=0", "num_concurrent"),
    ("bench logit-controls", "--prefill_len=1", "prefill_len"),
    ("bench engine-core", "--concurrency=64,0", "concurrency"),
    ("simulate hybrid-kv", "--max_tokens=0", "max_tokens"),
    ("simulate disagg", "--prefill_instances=2,0", "prefill_instances"),
    ("simulate disagg", "--tbt_stat=p50", "tbt_stat"),
    ("bench hybrid-kv", "--window=0", "window"),
    ("bench quality", "--parts=perplexity,speed", "parts"),
    ("bench spec-decode", "--batch_sizes=1,0", "batch_sizes"),
    ("simulate spec-decode", "--profile=tpu-v9", "profile"),
    ("simulate tenants", "--prompt_len=0", "prompt_len"),
]


def test_every_command_is_covered():
    assert {c.name for c in COMMANDS} == {name for name, _, _ in BAD}


@pytest.mark.parametrize("command, arg, flag", BAD)
def test_bad_flag_value_is_one_line_and_exit_1(command, arg, flag, capsys):
    assert cli.run(["jaxpaged", *command.split(), arg]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and f"--{flag}" in errors[0], err
    assert "Traceback" not in err


REQUIRED = {"convert": ["--hf_dir=in", "--out_dir=out"]}  # flags a command cannot run without


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_command_parses_its_defaults_and_rejects_an_unknown_flag(command, capsys):
    module, rest = cli.parse(command, REQUIRED.get(command.name, []))
    assert rest == [f"jaxpaged {command.name}"] and callable(module.main)
    assert cli.run(["jaxpaged", *command.words, "--no_such_flag=1"]) == 1
    assert "no_such_flag" in capsys.readouterr().err


def test_help_lists_every_command(capsys):
    assert cli.run(["jaxpaged", "--help"]) == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert f"  {command.name} " in out
    assert cli.run(["jaxpaged", "bench", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert "bench throughput" in err and "serve " not in err  # the bench group's commands only


def test_command_help_shows_its_flags(capsys):
    assert cli.run(["jaxpaged", "bench", "throughput", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--num_prompts" in out and "--block_size" in out and "EngineConfig.block_size" in out


@pytest.mark.parametrize("command", ["simulate serving", "capacity"])
def test_quick_commands_run_with_their_defaults(command, capsys):
    """The commands cheap enough for the suite run with no flags at all (the others' defaults are GPU/minutes-scale)."""
    assert cli.run(["jaxpaged", *command.split()]) == 0
    assert capsys.readouterr().out.strip()
