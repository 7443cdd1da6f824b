"""The SQLite ledger: every run, leg, reviewed-file hash, command line and billed GPU-hour.

db.py        the Ledger: every SQL statement the launcher runs, in transactions
spending.py  the Ledger's spending side: reservations, bills, what a dead launcher left
schema.py    the tables, their version, and the forward migrations
rows.py      what the reads return: one typed row per table (a damaged row read as far as it goes)
holders.py   who holds the ledger (so a lock error can name the process)
"""
