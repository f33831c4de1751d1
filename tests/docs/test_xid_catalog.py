"""gpulse's XID table (src/diagnosis/xid_catalog.rs) is generated from the transcribed catalog
(scripts/xid/catalog.csv) by scripts/xid/generate: the checked-in table is what the CSV gives,
and a CSV mistake is refused with its file and line rather than turned into a wrong table."""

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GENERATOR = REPO / "scripts" / "xid" / "generate"


def generator():
    loader = importlib.machinery.SourceFileLoader("xid_generate", str(GENERATOR))
    spec = importlib.util.spec_from_loader("xid_generate", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


HEADER = "# Source: x\n# Columns: y\nxid,mnemonic,immediate_action,investigatory_action,class,meaning\n"


def test_the_checked_in_table_is_what_the_csv_gives():
    done = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_range_gives_one_row_per_code_with_its_fatality():
    gen = generator()
    rows = list(gen.rows(HEADER + "39-41,CE_ERROR,RESTART_APP,CONTACT_SUPPORT,hardware,copy engine\n"
                                  "63,ROW_REMAP,IGNORE,(none),memory,row remap recorded\n"))
    assert [code for code, _ in rows] == [39, 40, 41, 63]
    table = gen.render(HEADER + "39-41,CE_ERROR,RESTART_APP,CONTACT_SUPPORT,hardware,copy engine\n"
                                "63,ROW_REMAP,IGNORE,(none),memory,row remap recorded\n")
    assert 'xid: 40, mnemonic: "CE_ERROR"' in table and "fatal: true" in table
    assert 'xid: 63,' in table and 'immediate_action: "ignore"' in table


@pytest.mark.parametrize("row, message", [
    ("13,GR,RESTART_APP,X,gpu,graphics", "catalog.csv:4: class 'gpu' is not one of"),
    ("13,GR,REBOOT_EVERYTHING,X,application,graphics", "catalog.csv:4: immediate action 'REBOOT_EVERYTHING'"),
    ("9-7,GR,RESTART_APP,X,application,graphics", "catalog.csv:4: range '9-7' runs backwards"),
    ("x,GR,RESTART_APP,X,application,graphics", "catalog.csv:4: code 'x' is neither a number"),
])
def test_a_bad_row_is_refused_with_its_line(row, message):
    gen = generator()
    with pytest.raises(gen.CatalogError, match=message.replace("(", r"\(").replace("[", r"\[")):
        list(gen.rows(HEADER + row + "\n"))


def test_a_code_given_twice_names_both_lines():
    gen = generator()
    with pytest.raises(gen.CatalogError, match=r"catalog.csv:5: XID 40 again \(first on line 4\)"):
        list(gen.rows(HEADER + "39-41,CE,RESTART_APP,X,hardware,copy engine\n"
                               "40,CE1,RESTART_APP,X,hardware,copy engine\n"))
