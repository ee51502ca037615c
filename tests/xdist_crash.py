"""`--dist loadgroup` that survives a worker's death: the crashed test fails, and the run goes on to its summary.

A native crash (SIGSEGV, SIGILL, abort) kills the pytest-xdist worker it runs in. xdist 3.8 reports that test as
failed and starts a replacement worker, but its group scheduler then loses the run in four ways:

- it puts the dead worker's whole workload back on the queue, finished groups too, and a replacement handed a group
  with nothing left to run is sent an empty batch that never completes: the run hangs;
- the test that crashed goes back with the rest of its group, so the replacement runs it again and dies too, until
  the restarts are spent and the run stops with tests never run;
- a replacement handed a single test waits for a second one (a worker runs a test once it knows the next, for
  fixture teardown) that is never sent: the run hangs;
- when two workers die together, work sent to the second before its death is noticed fails to send (OSError from
  execnet), an INTERNALERROR that ends the run. xdist's own shutdown command already ignores that error.

`CrashSafeLoadGroupScheduling` requeues only the unfinished tests, never the one that crashed, and keeps every worker
holding two tests or told to shut down; work it cannot send to a worker already dead stays assigned to it, and goes
back on the queue when that worker's death is handled. tests/conftest.py installs it through xdist's own hook,
`pytest_xdist_make_scheduler`; tests/test_suite_crash.py proves it on a run with a crashing test.
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling


class CrashSafeLoadGroupScheduling(LoadGroupScheduling):
    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        unfinished = {scope: unit for scope, unit in workload.items() if not all(unit.values())}
        if not unfinished:
            return None
        crashitem = next(nodeid for unit in unfinished.values() for nodeid, done in unit.items() if not done)
        unfinished[self._split_scope(crashitem)][crashitem] = True  # xdist reports it failed; a rerun would crash again
        self.workqueue.update({scope: unit for scope, unit in unfinished.items() if not all(unit.values())})
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node):
        super()._reschedule(node)
        if node.shutting_down:
            return
        while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
            self._assign_work_unit(node)
        if not self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
            node.shutdown()

    def _assign_work_unit(self, node):
        try:
            super()._assign_work_unit(node)  # records the unit as the node's, then sends it
        except OSError:  # the node died and its removal is on the way: remove_node requeues the unit then
            pass
