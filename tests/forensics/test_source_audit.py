"""What one source's counting finds: runs of nearby documents measured in text, lines met again in one later block,
and words standing in a template's delimiters."""

from __future__ import annotations

from burnout.forensics.audit_settings import AuditSettings
from burnout.forensics.source_audit import SourceAudit

FILLER = "The river rose in spring and the town moved its market to the hill above the old bridge. "


def _counted(documents: list[str], **settings) -> SourceAudit:
    audit = SourceAudit("source", "text", AuditSettings(**settings), [])
    for text in documents:
        audit.add(text)
    audit.flush()
    return audit


def test_a_run_of_nearby_documents_is_measured_in_characters_not_documents():
    """A term in two pages with one long page between them is in two runs; with a short line between, in one."""
    gap = 4000
    long_page = FILLER * (gap // len(FILLER) + 1)
    short_line = FILLER
    assert _counted(["zorbit here", long_page, "zorbit there"], run_gap_chars=gap).terms.items["zorbit"][2] == 2
    assert _counted(["zorbit here", short_line, "zorbit there"], run_gap_chars=gap).terms.items["zorbit"][2] == 1
    lines = ["zorbit here"] + [short_line] * 30 + ["zorbit there"]  # 30 short documents: 2,700 characters
    assert _counted(lines, run_gap_chars=gap).terms.items["zorbit"][2] == 1


def test_a_line_met_once_then_twice_in_a_later_block_counts_three_documents():
    """The first sighting only marks the seen filter; meeting the line in two documents of one later block must
    still count it (it once counted 2: a planted boilerplate line in 4 pages of Python's docs showed 3)."""
    line = "Click here to subscribe to our newsletter!"
    documents = [f"{line}\n{FILLER}"] + [f"{FILLER} {i}" for i in range(40)] + [f"{FILLER}\n{line}"] * 2
    audit = _counted(documents, block_docs=32)
    assert audit.lines.items[line][0] == 3


def test_unrendered_markup_is_counted_per_document():
    """Terms in a template's delimiters and HTML entities' names; not a shell's or str.format's fields."""
    documents = ["Dear {{user_name}}, your order {{ order_id }} ships today.", "Hi [[FIRST_NAME]] and {{user_name}}",
                 "%%CUSTOMER_ID%% <|im_start|> <<EOF>> {{ product.title }} <%= user.name %> <?= $title ?>",
                 "a&nbsp;b &amp;quot;escaped twice&amp;quot; &#8217;",
                 "a user_name in prose, a {user_name} in str.format, ${HOME}, Q&A; R&D"]
    audit = _counted(documents)
    assert audit.markup == {"user_name": 2, "order_id": 1, "FIRST_NAME": 1, "CUSTOMER_ID": 1, "im_start": 1,
                            "EOF": 1, "product.title": 1, "user.name": 1, "title": 1, "nbsp": 1, "amp": 1}
