"""Delivery modes: where a prompt for a busy session goes (docs/semantics.md).
The values of the proto enum ``DeliveryMode``; pure constants, so the turn
engine, the startup restore and the API share them without importing each
other."""

REJECT_IF_BUSY, FOLLOW_UP, QUEUE, INTERRUPT, ROLLBACK, STEER = 1, 2, 3, 4, 5, 6
MODE_NAMES = {REJECT_IF_BUSY: "REJECT_IF_BUSY", FOLLOW_UP: "FOLLOW_UP", QUEUE: "QUEUE",
              INTERRUPT: "INTERRUPT", ROLLBACK: "ROLLBACK", STEER: "STEER"}
