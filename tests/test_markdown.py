"""The markdown table writer of every report."""

from celerity_jax import markdown


def test_a_table_is_a_header_a_rule_and_a_row_per_item_with_cells_as_str():
    assert markdown.table(["run", "N", "loss"], [["d48", 117_072, 2.5], ["d64", None, 2.25]]) == [
        "| run | N | loss |",
        "|---|---|---|",
        "| d48 | 117072 | 2.5 |",
        "| d64 | None | 2.25 |",
    ]


def test_rows_may_be_any_iterable_and_a_table_may_be_empty():
    assert markdown.table(("a",), (row for row in [(1,), (2,)]))[2:] == ["| 1 |", "| 2 |"]
    assert markdown.table(["a", "b"], []) == ["| a | b |", "|---|---|"]
