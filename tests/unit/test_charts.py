"""The dependency-free SVG charts (``airflow_batchinfer.charts``) and the report's plots made with them."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from airflow_batchinfer.charts import Series, bar_chart, compact, line_chart, nice_ticks, side_by_side
from airflow_batchinfer.run.report.plots import plots
from airflow_batchinfer.run.report.render import render_markdown

SVG = "{http://www.w3.org/2000/svg}"


def parse(doc: str) -> ET.Element:
    root = ET.fromstring(doc)
    assert root.tag == f"{SVG}svg"
    return root


def find(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{SVG}{tag}") if cls in (e.get("class") or "").split()]


def texts(root: ET.Element) -> list[str]:
    return [e.text or "" for e in root.iter(f"{SVG}text")]


def test_a_bar_chart_is_an_svg_document_with_a_bar_per_value_and_series() -> None:
    doc = bar_chart(
        ["r0", "r1", "r2"],
        [
            Series("pending", [2000, 905, 420], color="#bbb"),
            Series("approved", [1095, 485, 229], color="#2a7"),
        ],
        overlay=True,
        title="records per round",
        x_label="round",
        width=400,
        height=250,
    )
    root = parse(doc)
    assert (root.get("width"), root.get("height"), root.get("viewBox")) == ("400", "250", "0 0 400 250")
    assert "font-family: sans-serif" in root.get("style", "")
    assert len(find(root, "rect", "s0")) == 3 and len(find(root, "rect", "s1")) == 3
    assert {e.get("fill") for e in find(root, "rect", "s0")} == {"#bbb"}
    assert {e.get("fill") for e in find(root, "rect", "s1")} == {"#2a7"}
    # overlaid: both series' bars share each category's x; approved (smaller) is drawn over pending
    assert [e.get("x") for e in find(root, "rect", "s0")] == [e.get("x") for e in find(root, "rect", "s1")]
    assert all(
        float(p.get("height")) > float(a.get("height"))
        for p, a in zip(find(root, "rect", "s0"), find(root, "rect", "s1"), strict=True)
    )
    bars = [e for e in root.iter(f"{SVG}rect") if "bar" in (e.get("class") or "")]
    assert bars.index(find(root, "rect", "s0")[0]) < bars.index(find(root, "rect", "s1")[0])
    words = texts(root)
    assert {"records per round", "round", "r0", "r1", "r2", "pending", "approved"} <= set(words)
    assert len(find(root, "rect", "legend")) == 2


def test_grouped_bars_sit_next_to_each_other() -> None:
    root = parse(bar_chart(["a", "b"], [Series("x", [1, 2]), Series("y", [3, 4])]))
    xs0 = [float(e.get("x")) for e in find(root, "rect", "s0")]
    xs1 = [float(e.get("x")) for e in find(root, "rect", "s1")]
    assert all(b > a for a, b in zip(xs0, xs1, strict=True))
    assert len(find(root, "rect", "bar")) == 4


def test_a_single_series_has_no_legend() -> None:
    root = parse(bar_chart(["a"], [Series("only", [1])], title="t"))
    assert find(root, "rect", "legend") == [] and "only" not in texts(root)


def test_a_fixed_y_range_bounds_the_axis_and_its_ticks() -> None:
    root = parse(bar_chart(["w1", "w2"], [Series("fill", [0.9, 0.95])], y_range=(0, 1.1)))
    assert {"0", "0.2", "0.4", "0.6", "0.8", "1"} <= set(texts(root))
    assert "1.2" not in texts(root)


def test_a_line_chart_has_a_point_per_value_and_one_line() -> None:
    doc = line_chart([0, 1, 2, 3], [Series("tokens / s", [36e3, 37.3e3, 34.5e3, 47.2e3])], x_label="round")
    root = parse(doc)
    assert len(find(root, "circle", "point")) == 4
    (line,) = find(root, "polyline", "line")
    assert len(line.get("points").split()) == 4
    # numeric x: placed by value, left to right; ticks at each x
    cx = [float(c.get("cx")) for c in find(root, "circle", "point")]
    assert cx == sorted(cx) and math.isclose(cx[1] - cx[0], cx[3] - cx[2], abs_tol=0.2)
    assert {"0", "1", "2", "3", "round", "50k", "40k"} <= set(texts(root))


def test_a_line_chart_places_numeric_x_by_value_and_strings_as_categories() -> None:
    cx = [
        float(c.get("cx"))
        for c in find(parse(line_chart([0, 1, 10], [Series("", [1, 2, 3])])), "circle", "s0")
    ]
    assert (cx[2] - cx[1]) > 5 * (cx[1] - cx[0])
    root = parse(line_chart(["mon", "tue", "wed"], [Series("", [1, 2, 3])]))
    cx = [float(c.get("cx")) for c in find(root, "circle", "s0")]
    assert math.isclose(cx[1] - cx[0], cx[2] - cx[1], abs_tol=0.2)
    assert {"mon", "tue", "wed"} <= set(texts(root))


def test_none_and_nan_values_are_skipped() -> None:
    root = parse(bar_chart(["a", "b", "c", "d"], [Series("s", [1, None, float("nan"), "x"])]))
    assert len(find(root, "rect", "bar")) == 1
    root = parse(line_chart([0, 1, 2, 3, 4], [Series("s", [1, 2, None, 4, float("inf")])]))
    assert len(find(root, "circle", "point")) == 3
    # a missing value breaks the line: one segment of two points, the lone point has none
    assert [len(p.get("points").split()) for p in find(root, "polyline", "line")] == [2]
    # a short series: the missing tail is missing values
    assert len(find(parse(bar_chart(["a", "b"], [Series("s", [1])])), "rect", "bar")) == 1


@pytest.mark.parametrize(
    "doc",
    [
        bar_chart([], [Series("s", [])], title="empty"),
        bar_chart(["a", "b"], [Series("s", [None, float("nan")])]),
        bar_chart(["a"], []),
        line_chart([], [Series("s", [])]),
        line_chart([0, 1], [Series("s", [None, None])]),
        side_by_side(),
    ],
)
def test_nothing_to_draw_says_no_data(doc: str) -> None:
    root = parse(doc)
    assert "no data" in texts(root)
    assert not find(root, "rect", "bar") and not find(root, "circle", "point")


def test_every_text_is_escaped() -> None:
    evil, amp = "<script>alert(1)</script>", "a & b"
    docs = [
        bar_chart(
            [evil, amp], [Series(evil, [1, 2]), Series(amp, [2, 1])], title=evil, x_label=amp, y_label=evil
        ),
        line_chart([evil, amp], [Series(evil, [1, 2]), Series(amp, [3, 4])], title=amp, x_label=evil),
        bar_chart([], [Series(evil, [])], title=evil, x_label=amp),  # no data, but still titled
    ]
    for doc in [*docs, side_by_side(*docs[:2])]:
        assert evil not in doc and amp not in doc and "<script" not in doc
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in doc and "a &amp; b" in doc
        root = parse(doc)
        assert evil in texts(root) and amp in texts(root)
        assert not list(root.iter(f"{SVG}script"))


def test_a_colour_cannot_break_out_of_its_attribute() -> None:
    doc = bar_chart(["a"], [Series("s", [1], color='red" onload="x')])
    assert 'onload="x"' not in doc
    assert parse(doc).find(f".//{SVG}rect[@class='bar s0']").get("fill") == 'red" onload="x'


def test_nice_ticks() -> None:
    assert nice_ticks(0, 937) == [0, 200, 400, 600, 800, 1000]
    assert nice_ticks(0, 1.1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2]
    assert nice_ticks(0, 3.7e6) == [0, 1e6, 2e6, 3e6, 4e6]
    assert nice_ticks(-5, 12) == [-5, 0, 5, 10, 15]
    assert nice_ticks(0, 0) == [-1, -0.5, 0, 0.5, 1]
    assert nice_ticks(0.1, 0.3) == [0.1, 0.15, 0.2, 0.25, 0.3]  # no 0.30000000000000004
    root = parse(bar_chart(["a"], [Series("s", [937])]))
    assert {"0", "200", "400", "600", "800", "1k"} <= set(texts(root))


def test_compact_numbers() -> None:
    assert [compact(v) for v in (0, 1, 1.0, 0.25, 937, 1000, 1234, 3.4e6, 2.5e9, -1500, 999.6)] == [
        "0",
        "1",
        "1",
        "0.25",
        "937",
        "1k",
        "1.23k",
        "3.4M",
        "2.5G",
        "-1.5k",
        "1k",
    ]


def test_side_by_side_places_charts_left_to_right() -> None:
    a = bar_chart(["a"], [Series("s", [1])], width=300, height=200)
    b = line_chart([0, 1], [Series("s", [1, 2])], width=400, height=250)
    root = parse(side_by_side(a, b))
    assert (root.get("width"), root.get("height"), root.get("viewBox")) == ("700", "250", "0 0 700 250")
    panels = root.findall(f"{SVG}svg")
    assert [(p.get("x"), p.get("width")) for p in panels] == [("0", "300"), ("300", "400")]
    with pytest.raises(ValueError, match="width and height"):
        side_by_side("<g/>")


def test_many_categories_thin_their_labels() -> None:
    names = [f"worker-{i:03d}" for i in range(60)]
    root = parse(bar_chart(names, [Series("fill", [0.5] * 60)]))
    shown = [t for t in texts(root) if t.startswith("worker-")]
    assert len(find(root, "rect", "bar")) == 60 and 1 < len(shown) < 60


def report(rounds: int = 3, workers: int = 2) -> dict:
    return {
        "rounds": [
            {
                "round": r,
                "pending": 1000 >> r,
                "approved": 600 >> r,
                "job_seconds": 2.0 / (r + 1),
                "tokens": {"prompt": 50_000 >> r, "completion": 20_000 >> r},
            }
            for r in range(rounds)
        ],
        "workers": {
            f"host-{i}.example:{9000 + i}": {
                "jobs": 3,
                "avg_fill": 0.9,
                "engine_busy_s": 1.8,
                "job_seconds": 2.0,
                "tokens": 1000,
            }
            for i in range(workers)
        },
    }


def test_the_report_plots_are_svg() -> None:
    out = plots(report())
    assert set(out) == {"rounds.svg", "workers.svg"}
    rounds, workers = (parse(out[n].decode()) for n in ("rounds.svg", "workers.svg"))
    assert len(rounds.findall(f"{SVG}svg")) == 2 and len(workers.findall(f"{SVG}svg")) == 2
    assert [e.get("fill") for e in find(rounds, "rect", "s0")] == ["#bbb"] * 3
    assert [e.get("fill") for e in find(rounds, "rect", "s1")] == ["#2a7"] * 3
    assert len(find(rounds, "circle", "point")) == 3
    assert {"records per round", "tokens / job-second (infer + judge)", "pending", "approved"} <= set(
        texts(rounds)
    )
    assert len(find(workers, "rect", "bar")) == 4
    assert {"average batch fill", "engine busy / job time", "example:9000"} <= set(texts(workers))


def test_the_report_plots_an_empty_run() -> None:
    out = plots(
        {"rounds": [{"round": 0, "pending": 0, "approved": 0, "job_seconds": 0, "tokens": {}}], "workers": {}}
    )
    assert "no data" in texts(parse(out["workers.svg"].decode()))
    rounds = parse(out["rounds.svg"].decode())
    assert "no data" in texts(rounds)  # no job time: no throughput point
    out = plots({"rounds": [], "workers": {}})
    assert all("no data" in texts(parse(doc.decode())) for doc in out.values())


def test_the_report_names_its_plots() -> None:
    md = render_markdown(
        report(rounds=0)
        | {
            "run_root": "r",
            "strategy": "rounds",
            "status": "complete",
            "stop_reason": "nothing pending",
            "input": {},
            "approved": 1,
            "accepted_by_review": 0,
            "remaining_pending": 0,
            "exhausted_in_place": 0,
            "failed_shards": [],
            "max_failed_shards": 0,
            "invariant": {"ok": True},
        }
    )
    assert "`rounds.svg`" in md and "`workers.svg`" in md and ".png" not in md
