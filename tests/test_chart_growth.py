"""The dashboard draws its chart again whenever points arrive (#16 item 5): a redraw must cost
the same at 100k points as at 1k, so only the points that arrived since the last draw are read
(counted, not timed: a series that counts the values read from it)."""

from __future__ import annotations

from array import array

from notebook_elastic.kernel.ui.chart import MAX_POINTS, chart_svg


class Counted(array):
    """An array of doubles (as ``MetricSeries`` keeps them) that counts the values read."""

    reads = 0

    def __iter__(self):
        self.reads += len(self)
        return super().__iter__()

    def __getitem__(self, index):
        got = super().__getitem__(index)
        self.reads += len(got) if isinstance(index, slice) else 1
        return got


def test_a_growing_series_is_drawn_again_reading_only_its_new_points():
    n = 100_000
    steps, values = Counted("d", range(n)), Counted("d", [1.0] * n)
    values[54_321] = 50.0
    chart_svg(steps, values, metric="loss")  # the first draw reads every point
    steps.reads = values.reads = 0
    for i in range(10):
        steps.append(n + i)
        values.append(-7.0 if i == 5 else 1.0)
    svg = chart_svg(steps, values, metric="loss", smoothing=0.6)
    assert values.reads <= 10 and steps.reads <= 10, (values.reads, steps.reads)  # before: 100,010 each
    assert f'data-total-points="{n + 10}"' in svg

    from notebook_elastic.kernel.ui.chart import series_points

    points = series_points(steps, values)
    assert len(points) <= MAX_POINTS
    assert (54_321, 50.0) in points and (n + 5, -7.0) in points  # spikes, old and new, survive
    assert [p[0] for p in points] == sorted(p[0] for p in points)


def test_a_series_that_starts_over_is_bucketed_afresh():
    steps, values = array("d", range(5000)), array("d", [2.0] * 5000)
    chart_svg(steps, values)
    del steps[100:], values[100:]  # shorter than what was bucketed: not appended to
    steps.extend(range(100, 3000))
    values.extend([3.0] * 2900)
    from notebook_elastic.kernel.ui.chart import series_points

    points = series_points(steps, values)
    assert {v for _, v in points} == {2.0, 3.0}  # before the fix too; after it, not 2.0 for steps >= 100
    assert all(v == 3.0 for s, v in points if s >= 100) and max(s for s, _ in points) > 2900
