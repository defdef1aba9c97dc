"""The acceptance plot of `eagle-zoo bench --plot`: one bar per draft position on integer
ticks, and a title that fits inside the figure (a hub id and a target name on one line
did not: the shipped plot's title was cut at both edges)."""
import pytest

pytest.importorskip("matplotlib")
import matplotlib.pyplot as plt  # noqa: E402

from eagle_zoo.bench import BenchResult, acceptance_figure, plot_title, save_plot  # noqa: E402


def _result():
    return BenchResult(method="eagle3", draft="eagle-zoo/EAGLE3-SmolLM2-135M-Instruct", num_prompts=80,
                       generated_tokens=100, seconds=1.0, mean_acceptance_length=2.895,
                       acceptance_rates=[0.780, 0.617, 0.498])


def test_ticks_are_the_draft_positions():
    fig = acceptance_figure([0.78, 0.62, 0.50], "t")
    ticks = list(fig.axes[0].get_xticks())
    plt.close(fig)
    assert ticks == [1, 2, 3]


def test_title_fits_the_figure_and_names_the_mean():
    title = plot_title(_result(), "HuggingFaceTB/SmolLM2-135M-Instruct", 3)
    assert "2.895" in title and "k=3" in title
    fig = acceptance_figure([0.78, 0.62, 0.50], title)
    fig.canvas.draw()
    box = fig.axes[0].title.get_window_extent()
    width = fig.bbox.width
    plt.close(fig)
    assert 0 <= box.x0 and box.x1 <= width, (box, width)


def test_save_plot_writes_a_png(tmp_path):
    out = tmp_path / "accept.png"
    save_plot([0.5, 0.25], str(out), "t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
