"""`coordinator demo`: the project's main job, end to end on one machine with nothing installed
but Python, Java and pyspark: payments through a lossy network, settled by Spark exactly once.

1. An embedded coordinator (`coordinator serve` on a temporary SQLite file and a free port).
2. Payments from an idempotent SDK Producer whose HTTP transport loses some answers after the
   service handled the request: the producer retries and the service answers `duplicate: true`.
3. The settlement job (`jobs.settlement`, batch mode, once per wave of payments) on a standalone
   Spark mini cluster with speculation on, where one write task's first attempt dies after
   writing part of its output and another's stalls until Spark runs a speculative copy. The
   settlements go into a SQL table (an SQLite file, through txsql, the input offsets with
   them; `--output topic`: the `settlements` topic through txlog).
4. Each committed settlement paid out to its merchant at a stand-in bank (an HTTP endpoint in
   this process that counts every call) through `EffectsClient.once`, in Spark tasks where one
   attempt dies after a payout and another stalls.
5. What happened, from the transport, Spark's event log, the coordinator's admin API and the
   bank, and the settlements read back against totals computed here from what was generated.

The parts: `payments`, `network`, `bank`, `service`, `run`, `evidence`, `reconcile`, `report`
and `cli`. The last line printed is one JSON object of the figures; `mismatches` is 0 when
exactly once held (and the bank's calls equal the payouts).
"""

from jobs.demo.bank import StandInBank, payout_faults
from jobs.demo.cli import _demo, add_demo_parser, main
from jobs.demo.common import Options
from jobs.demo.evidence import JobTransactions, SparkTasks, SqlCommits
from jobs.demo.network import DroppingTransport
from jobs.demo.payments import generate_payments, waves
from jobs.demo.reconcile import Reconciliation, reconcile
from jobs.demo.run import faults_for, produce_payments, run
from jobs.demo.service import embedded_coordinator, read_topic

__all__ = [
    "DroppingTransport",
    "JobTransactions",
    "Options",
    "Reconciliation",
    "SparkTasks",
    "SqlCommits",
    "StandInBank",
    "_demo",
    "add_demo_parser",
    "embedded_coordinator",
    "faults_for",
    "generate_payments",
    "main",
    "payout_faults",
    "produce_payments",
    "read_topic",
    "reconcile",
    "run",
    "waves",
]
