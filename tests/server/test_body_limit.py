"""`json_values_at_most` never undercounts: against the values `json.loads` builds, for any JSON value."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpaged.server.body_limit import json_values_at_most

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=6),
    max_leaves=40)


def _values(value) -> int:
    """The JSON values in a parsed document (an object's keys are not values, as the parser keeps them in its
    dict): the reference count."""
    if isinstance(value, list):
        return 1 + sum(_values(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(_values(v) for v in value.values())
    return 1


@settings(max_examples=150, deadline=None)
@given(json_values, st.booleans())
def test_the_bound_is_at_least_the_number_of_values(value, compact):
    text = json.dumps(value, separators=(",", ":") if compact else None).encode()
    assert json_values_at_most(text) >= _values(json.loads(text))


def test_the_bound_is_exact_for_a_flat_list_of_numbers():
    assert json_values_at_most(json.dumps(list(range(1000))).encode()) == 1001
