"""A driver whose tasks Spark retries (``local[2,2]``), for the id store's abort test.

``python -m tests.core.idstore_retry_driver LOG CHECKPOINT FLAG``: drains LOG through
``deduplicate`` on onceflow's id store while batch 4's dedup stage fails once (see
:func:`tests.core.test_idstore.run`); Spark retries the task in the same query run, on the
provider that saw the failed attempt. Prints each batch's rows as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from onceflow.runtime import idstore
from onceflow.runtime.session import session
from tests.core.test_idstore import run

if __name__ == "__main__":
    log, checkpoint, flag = (Path(a) for a in sys.argv[1:4])
    spark = session(master="local[2,2]", app_name="idstore-retry", id_store=True)
    out = run(spark, idstore.PROVIDER_CLASS, log, checkpoint, fail_batch=4, flag=flag)
    rows = {str(b): [[str(v) for v in row] for row in batch] for b, batch in out.items()}
    print(json.dumps(rows), flush=True)
