"""`OptionFlags`: an options dataclass becomes flags of its fields' names, types, defaults and checks, and back."""

import dataclasses

import pytest
from absl import flags

from jaxpaged.bench.options import option
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.options import OptionFlags


@dataclasses.dataclass(frozen=True)
class Options:
    """Every kind of field a command declares."""

    count: int = option(3, "how many", at_least=1)
    rate: float | None = option(None, "per second", at_least=0)
    name: str = option("a", "one of three", choices=["a", "b", "c"])
    verbose: bool = option(False, "say more")
    sizes: tuple[int, ...] = option((1, 2), "sizes", at_least=1)
    scales: tuple[float, ...] = option((), "scales, maybe none", at_least=0)
    modes: tuple[str, ...] = option(("x",), "modes", choices=["x", "y"])
    given: int = 7  # no option: the command fills it


def _parsed(*argv):
    fs = FlagSet()
    opts = OptionFlags(fs, Options)
    fs.parse(["prog", *argv])
    return fs, opts


def test_defaults_round_trip_to_the_dataclass():
    fs, opts = _parsed()
    assert opts.options() == Options()
    assert "given" not in fs.values  # a plain field is no flag
    assert fs["count"].help == "how many" and fs["sizes"].default == ["1", "2"]


def test_parsed_values_come_back_typed():
    _, opts = _parsed("--count=5", "--rate=0.5", "--name=c", "--verbose", "--sizes=4,8", "--scales=0.5,2",
                      "--modes=y,x")
    assert opts.options(given=1) == Options(count=5, rate=0.5, name="c", verbose=True, sizes=(4, 8),
                                            scales=(0.5, 2.0), modes=("y", "x"), given=1)


@pytest.mark.parametrize("arg", ["--count=0", "--rate=-1", "--name=d", "--sizes=1,0", "--sizes=", "--modes=z",
                                 "--scales=-1"])
def test_each_check_refuses_a_bad_value(arg):
    with pytest.raises(flags.IllegalFlagValueError, match=arg.split("=")[0].lstrip("-")):
        _parsed(arg)


def test_a_list_of_numbers_must_declare_its_bound():
    @dataclasses.dataclass(frozen=True)
    class Unbounded:
        """A list of numbers without at_least."""

        sizes: tuple[int, ...] = option((1,), "sizes")

    with pytest.raises(TypeError, match="Unbounded.sizes"):
        OptionFlags(FlagSet(), Unbounded)
