"""The engine: runs one task at a time under a lease and changes its state (R5, R11, R15).

``runner`` is the single place that changes a task's state and commits it; ``recovery``,
``events``, ``timers`` and ``degrade`` decide what a crash, an event, a due time or a
degraded mode means for the task, through the narrow interface in ``task``; ``worker``
claims tasks and keeps their leases; ``inbox`` stores events on their way in.
"""
