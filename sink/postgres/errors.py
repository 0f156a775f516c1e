"""PostgreSQL write failures by SQLSTATE: refused rows, passing failures, fatal ones."""

from __future__ import annotations

from sink.store import RowsRefusedError, TransientWriteError

__all__ = ["FATAL", "REFUSED", "TRANSIENT", "severity"]

# Write failures by SQLSTATE class (its first two characters). Refused: the data cannot be
# written, ever (the result goes to the dead-letter topic with this code, the next ones are
# written). Transient: connection (08), resources (53: retried for write_retry_s, then the
# sink exits), operator intervention such as a shutdown (57), system errors (58) and
# transaction rollbacks, serialization failures and deadlocks (40). Anything else, and the
# states in FATAL, is the target's configuration: the sink exits with status 2.
REFUSED = {
    "22": "invalid_value",  # data exception: a value the column or type cannot hold
    "23": "constraint_violation",  # integrity: a constraint of the table refuses the row
    "42": "statement_refused",  # syntax or access rule, for this data
    "54": "limit_exceeded",  # program limit: an index row, a value, too large
}
TRANSIENT = {"08", "40", "53", "57", "58"}
FATAL = {
    "42501": "not allowed to write the table",
    "42P01": "the table is gone",
    "42703": "the table lacks a column",
}


def severity(error: BaseException) -> int:
    if isinstance(error, RowsRefusedError):
        return 2
    return 1 if isinstance(error, TransientWriteError) else 0
