"""Figure helpers: compact tick labels and line styles that keep identical curves apart."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from tiny_llm.plotting import compact_axis, compact_number, line_styles, plain_log_axis  # noqa: E402


@pytest.mark.parametrize(
    ("value", "label"),
    [
        (0, "0"),
        (7, "7"),
        (950, "950"),
        (0.25, "0.25"),
        (1000, "1k"),
        (12_500, "12.5k"),
        (100_000, "100k"),
        (120_000, "120k"),
        (999_999, "1M"),
        (1_200_000, "1.2M"),
        (1_234_567, "1.23M"),
        (3e9, "3B"),
        (-2500, "-2.5k"),
    ],
)
def test_compact_number(value, label):
    assert compact_number(value) == label


def test_compact_axis_labels_are_short_and_few():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1_300_000], [1, 2])
    compact_axis(ax.xaxis)
    fig.canvas.draw()
    low, high = ax.get_xlim()
    labels = [t.get_text() for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]
    plt.close(fig)
    assert 3 <= len(labels) <= 7
    assert all(len(label) <= 5 for label in labels), labels
    assert "1M" in labels and "0" in labels


def test_line_styles_differ_in_colour_marker_and_dashes():
    styles = line_styles(6)
    assert len({(s["color"], s["marker"], s["linestyle"]) for s in styles}) == 6
    for a, b in zip(styles, styles[1:], strict=False):
        assert a["marker"] != b["marker"] and a["linestyle"] != b["linestyle"] and a["color"] != b["color"]
        assert a["markersize"] > b["markersize"]  # identical curves show as nested markers
    assert all(s["markerfacecolor"] == "none" for s in styles)
    assert line_styles(1)[0]["markersize"] == 9.0


@pytest.mark.parametrize(
    ("low", "high", "shown"),
    [
        (0.1, 0.6, ["0.2", "0.3", "0.4", "0.6"]),  # not 2×10⁻¹ ... on the minor ticks
        (7.0, 7.2, ["7", "7.1", "7.2"]),
    ],
)
def test_a_narrow_log_axis_reads_as_plain_numbers(low, high, shown):
    fig, ax = plt.subplots(figsize=(3, 3))
    ax.plot([0, 1], [low, high])
    ax.set_yscale("log")
    plain_log_axis(ax.yaxis)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.yaxis.get_majorticklabels() + ax.yaxis.get_minorticklabels()]
    plt.close(fig)
    assert set(shown) <= set(labels), labels
    assert not any("10" in label and "^" in label or "×" in label for label in labels), labels


def test_a_wide_log_axis_keeps_powers_of_ten():
    fig, ax = plt.subplots(figsize=(3, 3))
    ax.plot([0, 1], [1e-4, 0.6])
    ax.set_yscale("log")
    plain_log_axis(ax.yaxis)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.yaxis.get_majorticklabels() if t.get_text()]
    plt.close(fig)
    assert labels and all("10^" in label for label in labels), labels
