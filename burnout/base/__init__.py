"""The bottom layer every stage shares: file names and safe writes (files), output folders' owner and one writer
(folders), a user's values checked (values), text for a person (text), and what the machine has to give (machine).

It imports nothing from burnout but errors, so any module may import it.
"""
