"""Metric names used by PromQL expressions (enough PromQL for our rules and dashboard)."""

from __future__ import annotations

import re

FUNCTIONS = {
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "rate",
    "irate",
    "increase",
    "histogram_quantile",
    "clamp_min",
    "clamp_max",
    "label_replace",
    "by",
    "without",
    "on",
    "ignoring",
    "unless",
    "and",
    "or",
    "group_left",
    "group_right",
    "abs",
    "absent",
    "topk",
    "bottomk",
    "min_over_time",
    "max_over_time",
    "avg_over_time",
    "sum_over_time",
    "deriv",
}


def metric_names(expr: str) -> set[str]:
    """The metric (series) names an expression reads."""
    text = re.sub(r'"[^"]*"', " ", expr)  # strings
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", text)  # grouping labels
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    names = set(re.findall(r"\b[A-Za-z_:][A-Za-z0-9_:]*\b", text))
    return {n for n in names if n not in FUNCTIONS and not n.startswith("__")}


def scrape_names(text: str) -> set[str]:
    """Series names in a Prometheus text exposition."""
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")}
