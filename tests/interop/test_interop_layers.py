"""Layer-index conventions, on hand-computed cases (eyas id = input of decoder layer i)."""

from eyas.layers import (
    default_aux_layers,
    from_sglang,
    from_speculators,
    specforge_default_aux_layers,
    to_sglang,
    to_speculators,
)


def test_defaults_by_hand():
    # N = 32 (Llama-3.1-8B): inputs of layers 2, 16, 29; SpecForge writes outputs of 1, 15, 28
    assert default_aux_layers(32) == [2, 16, 29]
    assert specforge_default_aux_layers(32) == [1, 15, 28]
    # N = 61: the [2, 30, 58] of a real deployment; N = 8: the tiny test target
    assert default_aux_layers(61) == [2, 30, 58] and specforge_default_aux_layers(61) == [1, 29, 57]
    assert default_aux_layers(8) == [2, 4, 5] and specforge_default_aux_layers(8) == [1, 3, 4]


def test_sglang_is_one_lower():
    # SGLang captures layers_to_capture = [val + 1 for val in ids]
    assert from_sglang([1, 15, 28]) == [2, 16, 29]
    assert to_sglang([2, 16, 29]) == [1, 15, 28]
    assert from_sglang(specforge_default_aux_layers(80)) == default_aux_layers(80) == [2, 40, 77]


def test_speculators_is_eyas_indexing():
    # vLLM captures before layer idx runs; speculators defaults to [2, N // 2, N - 3]
    assert from_speculators([2, 16, 29]) == [2, 16, 29] == to_speculators([2, 16, 29])
    assert to_sglang(from_speculators([1, 4, 6])) == [0, 3, 5]


def test_small_targets_get_three_distinct_layers_and_repeats_are_refused():
    """Below 7 layers the reference [2, N//2, N-3] collides ([2, 2, 1] at 4): training took it and loading then
    refused the draft. Test-sized targets get three distinct layers; a repeated id is refused where it is set."""
    import pytest

    from eyas.errors import EyasError
    from eyas.layers import check_aux_layers

    for n in range(3, 12):
        ids = default_aux_layers(n)
        assert ids == sorted(set(ids)) and len(ids) == 3 and check_aux_layers(ids, n) == ids, n
    assert default_aux_layers(4) == [1, 2, 3] and default_aux_layers(7) == [2, 3, 4]
    with pytest.raises(EyasError, match="repeat a layer") as e:
        check_aux_layers([2, 2, 1], 4)
    assert "[1, 2, 3]" in e.value.fix
    with pytest.raises(EyasError, match="has 2 decoder layers"):
        default_aux_layers(2)
