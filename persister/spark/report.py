"""What `spool audit` writes: Parquet tables, `report.json` and a one-page `report.html`.

Tables under OUT/ (Parquet, one directory each): `records` (every share-state record
read, with its segment file, byte position and offset), `violations` (rule, key,
position, message) and `partition_stats` (per group and share partition: accepted,
archived and of those dead-lettered (KIP-1191), still archiving, released, redelivered,
lag, delivery-count histogram).

`report.html` is self-contained (inline CSS and SVG, no scripts): a pass/fail line per
rule, the violations, and per share partition a bar of where its offsets stand and a
histogram of delivery counts.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from persister.spark.findings import AuditResult, LogRecord, Violation
from persister.spark.segments import row_schema

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

# The HTML lists at most this many violations; report.json and the table hold them all.
HTML_VIOLATION_ROWS = 500
_REPORT_VERSION = 1


# ------------------------------------------------------------------ Parquet


def records_schema() -> StructType:
    """The records table: the compact job's row columns the audit reads, plus where the
    record came from (`source`: log or compacted output) and its batch's byte position."""
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    # The compact job's columns this table shares, in its order.
    shared = [f for f in row_schema().fields if f.name in LogRecord._fields]
    schema = StructType(
        [
            StructField("source", StringType(), False),
            StructField("byte_position", LongType(), False),
            *shared,
            StructField("batch_count", IntegerType(), False),
        ]
    )
    assert tuple(schema.fieldNames()) == RECORD_COLUMNS, schema.fieldNames()
    return schema


# The records table's columns, in `records_schema` order (`record_row` builds them so).
RECORD_COLUMNS = (
    "source",
    "byte_position",
    "segment",
    "offset",
    "record_type",
    "group_id",
    "topic_id",
    "partition",
    "snapshot_epoch",
    "state_epoch",
    "leader_epoch",
    "start_offset",
    "batches",
    "batch_count",
)


def record_row(r: LogRecord) -> tuple[Any, ...]:
    """The record as a records table row (`RECORD_COLUMNS`); fields its type does not
    carry are null. Built field by field: one per record of the log, so it counts."""
    kind = r.record_type
    live = kind != "tombstone"
    return (
        r.source,
        r.byte_position,
        r.segment,
        r.offset,
        kind,
        r.group_id,
        r.topic_id,
        r.partition,
        r.snapshot_epoch if live else None,
        r.state_epoch if kind == "snapshot" else None,
        r.leader_epoch if live else None,
        r.start_offset if live else None,
        [tuple(b) for b in r.batches],
        len(r.batches),
    )


def records_frame(spark: SparkSession, rows: RDD[tuple[Any, ...]]) -> DataFrame:
    """The records table (`records_schema`) of `record_row`s.

    The rows reach the JVM as they are: their state batches are plain arrays, made
    structs there, so Python converts nothing per row (converting each row's batches to
    structs in Python cost more than the rest of the table). They are built from
    decoded records, so they are not checked against the schema again either."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, LongType, StructField, StructType

    schema = records_schema()
    batches = schema["batches"]
    batch: StructType = batches.dataType.elementType  # type: ignore[attr-defined]
    plain = StructType(
        [
            StructField(f.name, ArrayType(ArrayType(LongType(), False), False), f.nullable)
            if f.name == "batches"
            else f
            for f in schema.fields
        ]
    )
    frame = spark.createDataFrame(rows, plain, verifySchema=False)

    def as_struct(b: Any) -> Any:
        # coalesce with a literal: the struct's fields are not null, as in the schema.
        return F.struct(
            *[
                F.coalesce(b[i], F.lit(0)).cast(f.dataType).alias(f.name)
                for i, f in enumerate(batch.fields)
            ]
        )

    return frame.withColumn("batches", F.transform("batches", as_struct))


def violations_schema() -> StructType:
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    text, num = StringType(), LongType()
    return StructType(
        [
            StructField("rule", text, False),
            StructField("group_id", text, True),
            StructField("topic_id", text, True),
            StructField("topic", text, True),
            StructField("partition", IntegerType(), True),
            StructField("segment", text, False),
            StructField("offset", num, True),
            StructField("byte_position", num, True),
            StructField("message", text, False),
        ]
    )


def stats_schema() -> StructType:
    from pyspark.sql.types import (
        BooleanType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    num = LongType()
    fields = [
        StructField("group_id", StringType(), False),
        StructField("topic_id", StringType(), False),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), False),
        StructField("deleted", BooleanType(), False),
        StructField("state_epoch", IntegerType(), True),
        StructField("start_offset", num, True),
        StructField("log_end_offset", num, True),
    ]
    fields += [
        StructField(name, num, nullable)
        for name, nullable in (
            ("records", False),
            ("snapshots", False),
            ("updates", False),
            ("tombstones", False),
            ("accepted", False),
            ("archived", False),
            ("dead_lettered", False),
            ("archiving", False),
            ("released", False),
            ("redelivered", False),
            ("lag", True),
        )
    ]
    fields += [
        StructField("delivery_count_limit", IntegerType(), False),
        StructField("limit_source", StringType(), False),
        StructField("delivery_count_histogram", MapType(StringType(), num), False),
    ]
    return StructType(fields)


def write_tables(
    spark: SparkSession,
    rows: RDD[tuple[Any, ...]],
    violations: list[Violation],
    partitions: list[dict[str, Any]],
    out: Path,
) -> None:
    """OUT/records (from `rows`, each a `record_row`), OUT/violations and
    OUT/partition_stats as Parquet (overwritten)."""
    records_frame(spark, rows).write.mode("overwrite").parquet(str(out / "records"))
    v_schema = violations_schema()
    spark.createDataFrame(
        [tuple(v.to_dict()[f.name] for f in v_schema.fields) for v in violations], v_schema
    ).coalesce(1).write.mode("overwrite").parquet(str(out / "violations"))
    s_schema = stats_schema()
    spark.createDataFrame(
        [tuple(p[f.name] for f in s_schema.fields) for p in partitions], s_schema
    ).coalesce(1).write.mode("overwrite").parquet(str(out / "partition_stats"))


# ------------------------------------------------------------------ JSON and HTML


def report_document(result: AuditResult) -> dict[str, Any]:
    return {
        "version": _REPORT_VERSION,
        "passed": result.passed,
        "summary": result.summary,
        "checks": [
            {
                **check,
                "violations": [v.to_dict() for v in result.violations if v.rule == check["rule"]],
            }
            for check in result.checks
        ],
        "partitions": result.partitions,
    }


def write_reports(result: AuditResult, out: Path) -> None:
    document = report_document(result)
    (out / "report.json").write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    (out / "report.html").write_text(render_html(document))


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}
.pass{color:#fff;background:#2e7d32;padding:1px 8px;border-radius:3px}
.fail{color:#fff;background:#c62828;padding:1px 8px;border-radius:3px}
.part{display:inline-block;margin:0 18px 18px 0;vertical-align:top}
.legend span{display:inline-block;margin-right:12px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
small{color:#666}
"""
# accepted, archived, archiving (a dead-letter copy being written), released, lag
_COLOURS = {
    "accepted": "#2e7d32",
    "archived": "#c62828",
    "archiving": "#6a1b9a",
    "released": "#f9a825",
    "lag": "#90a4ae",
}


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _badge(passed: bool) -> str:
    return '<span class="pass">PASS</span>' if passed else '<span class="fail">FAIL</span>'


def _stack_bar(p: dict[str, Any], width: int = 320) -> str:
    """One bar: accepted | archived | archiving | released | lag, scaled to their sum."""
    parts = [(name, int(p.get(name) or 0)) for name in _COLOURS]
    total = sum(v for _, v in parts) or 1
    x, rects = 0.0, []
    for name, value in parts:
        w = width * value / total
        if value:
            rects.append(
                f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="18" '
                f'fill="{_COLOURS[name]}"><title>{name}: {value}</title></rect>'
            )
        x += w
    return (
        f'<svg width="{width}" height="18" role="img" aria-label="offsets">'
        + "".join(rects)
        + f'<rect x="0" y="0" width="{width}" height="18" fill="none" stroke="#999"/></svg>'
    )


def _histogram(hist: dict[str, int], limit: int, width: int = 320, height: int = 90) -> str:
    """Offsets per delivery count, bars from 0 to the limit (and beyond, in red)."""
    top = max([limit, *(int(k) for k in hist)])
    counts = [int(hist.get(str(c), 0)) for c in range(top + 1)]
    peak = max(counts) or 1
    slot = width / len(counts)
    bars = []
    for c, n in enumerate(counts):
        h = (height - 16) * n / peak
        colour = "#c62828" if c > limit else "#1565c0"
        bars.append(
            f'<rect x="{c * slot + 1:.1f}" y="{height - 16 - h:.1f}" width="{slot - 2:.1f}" '
            f'height="{h:.1f}" fill="{colour}"><title>count {c}: {n} offsets</title></rect>'
            f'<text x="{c * slot + slot / 2:.1f}" y="{height - 3}" font-size="10" '
            f'text-anchor="middle">{c}</text>'
        )
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="delivery counts">'
        + "".join(bars)
        + "</svg>"
    )


def render_html(document: dict[str, Any]) -> str:
    summary = document["summary"]
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>spool audit</title><style>",
        _CSS,
        "</style></head><body>",
        f"<h1>spool audit {_badge(document['passed'])}</h1>",
        f"<p>data dir <code>{_e(summary.get('data_dir'))}</code>: "
        f"{_e(summary.get('segments'))} segment files, {_e(summary.get('keys'))} share "
        f"partitions. Replay compared: {_e(summary.get('replay_comparison'))}.</p>",
        f"<p>Offsets accepted {_e(summary.get('accepted'))}, archived "
        f"{_e(summary.get('archived'))} (dead-lettered {_e(summary.get('dead_lettered'))}), "
        f"still archiving {_e(summary.get('archiving'))}.</p>",
        "<h2>Checks</h2><table><tr><th>rule</th><th></th><th>violations</th>"
        "<th>what it checks</th></tr>",
    ]
    for check in document["checks"]:
        out.append(
            f"<tr><td><code>{_e(check['rule'])}</code></td><td>{_badge(check['passed'])}</td>"
            f"<td>{len(check['violations'])}</td><td>{_e(check.get('description'))}</td></tr>"
        )
    out.append("</table>")
    violations = [v for check in document["checks"] for v in check["violations"]]
    out.append(f"<h2>Violations ({len(violations)})</h2>")
    if violations:
        out.append(
            "<table><tr><th>rule</th><th>group</th><th>topic</th><th>partition</th>"
            "<th>segment</th><th>offset</th><th>message</th></tr>"
        )
        for v in violations[:HTML_VIOLATION_ROWS]:
            topic = v.get("topic") or v.get("topic_id")
            out.append(
                f"<tr><td><code>{_e(v['rule'])}</code></td><td>{_e(v['group_id'])}</td>"
                f"<td>{_e(topic)}</td><td>{_e(v['partition'])}</td><td>{_e(v['segment'])}</td>"
                f"<td>{_e(v['offset'])}</td><td>{_e(v['message'])}</td></tr>"
            )
        out.append("</table>")
        if len(violations) > HTML_VIOLATION_ROWS:
            out.append(
                f"<p><small>{len(violations) - HTML_VIOLATION_ROWS} more in report.json and "
                "the violations table.</small></p>"
            )
    else:
        out.append("<p>None.</p>")
    out.append("<h2>Share partitions</h2><p class='legend'>")
    out += [
        f"<span><i class='sw' style='background:{c}'></i>{name}</span>"
        for name, c in _COLOURS.items()
    ]
    out.append("</p>")
    for p in document["partitions"]:
        topic = p.get("topic") or p.get("topic_id")
        out.append(
            f"<div class='part'><b>{_e(p['group_id'])}</b> {_e(topic)}-{_e(p['partition'])}"
            + (" <small>(deleted)</small>" if p.get("deleted") else "")
            + f"<br><small>start {_e(p.get('start_offset'))}, log end "
            f"{_e(p.get('log_end_offset'))}; accepted {_e(p['accepted'])}, archived "
            f"{_e(p['archived'])} (dead-lettered {_e(p.get('dead_lettered'))}), archiving "
            f"{_e(p.get('archiving'))}, released {_e(p['released'])}, redelivered "
            f"{_e(p['redelivered'])}, lag {_e(p.get('lag'))}</small><br>"
            + _stack_bar(p)
            + f"<br><small>delivery counts (limit {_e(p['delivery_count_limit'])}, "
            f"{_e(p['limit_source'])})</small><br>"
            + _histogram(p["delivery_count_histogram"], int(p["delivery_count_limit"]))
            + "</div>"
        )
    out.append("</body></html>\n")
    return "".join(out)
