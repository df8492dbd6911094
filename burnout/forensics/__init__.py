"""Corpus forensics: `burnout data audit` finds what should not be in a corpus without being told what it is
(audit.py and the modules it names); `burnout data trace` finds where a string, or a run's generated text,
occurs in a prepared data folder (trace.py)."""
