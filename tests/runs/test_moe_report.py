"""report.html of a mixture-of-experts run: a section with each sparse layer's expert load; a dense run's has none."""

import dataclasses
import json

import pytest
import torch

from gptlab.model import preset
from gptlab.model.moe import MoE
from gptlab.runs import write_report
from gptlab.runs.report import REPORT_FILE
from gptlab.train import Trainer

from ..train.conftest import tiny_config
from .page import Page

SECTION = "Mixture of experts"


def train_moe(prepared, out, **moe_changes):
    model = preset("moe-tiny", block_size=32)
    model = dataclasses.replace(model, moe=dataclasses.replace(model.moe, **moe_changes))
    Trainer(tiny_config(prepared, out, model=model, precision="fp32", max_steps=3), log=lambda *_: None).fit()
    return out


def test_moe_report_has_a_section_whose_table_is_the_last_logged_load(prepared, tmp_path):
    out = train_moe(prepared, tmp_path / "moe", capacity_factor=1.0)
    page = Page((out / REPORT_FILE).read_text())
    assert SECTION in page.text
    last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line][-1]
    rows = page.tables["Expert load at step 3"]
    assert rows[0] == ["layer", "max / mean load", "dropped", "balance loss", "z-loss", "tokens per expert"]
    assert [int(row[0]) for row in rows[1:]] == [layer["layer"] for layer in last["moe_layers"]] == [0, 1]
    for row, layer in zip(rows[1:], last["moe_layers"]):
        assert row[1] == f"{layer['max_load']:.4f}" and row[2] == f"{layer['dropped']:.2%}"
        assert row[5] == " ".join(f"{share:.0%}" for share in layer["tokens"])
    alts = [attrs.get("alt", "") for tag, attrs in page.tags if tag == "img"]
    assert any(alt.startswith("expert load per sparse layer") for alt in alts)
    assert not any("moe_" in alt for alt in alts)  # drawn in their own section, not again among the other figures


def test_moe_report_shows_a_collapsed_router_at_n_experts_over_top_k(prepared, tmp_path, monkeypatch):
    original = MoE.route

    def collapsed(self, flat):
        with torch.no_grad():
            self.route_bias.copy_(torch.tensor([0.0, 0.0, 10.0, 10.0]))  # every token picks experts 2 and 3
        return original(self, flat)

    monkeypatch.setattr(MoE, "route", collapsed)
    out = train_moe(prepared, tmp_path / "collapsed")
    rows = Page((out / REPORT_FILE).read_text()).tables["Expert load at step 3"][1:]
    assert [(row[1], row[5]) for row in rows] == [("2.0000", "0% 0% 50% 50%")] * 2


def test_dense_report_has_no_moe_section(prepared, tmp_path):
    out = tmp_path / "dense"
    Trainer(tiny_config(prepared, out, max_steps=2), log=lambda *_: None).fit()
    html = (out / REPORT_FILE).read_text()
    assert SECTION not in html and "Expert load" not in html
    assert write_report(out).read_text() == html  # rewritten from the same files: the same page


@pytest.mark.parametrize("logged", [1, 3])
def test_moe_report_draws_runs_of_one_or_more_logged_steps(prepared, tmp_path, logged):
    """A run logged once (a heatmap one step wide) still draws; the section's table is its only step."""
    out = train_moe(prepared, tmp_path / "moe")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    kept = [line for line in lines if '"loss"' not in line or json.loads(line)["step"] > 3 - logged]
    (out / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    page = Page(write_report(out).read_text())
    assert len(page.tables["Expert load at step 3"]) == 3
