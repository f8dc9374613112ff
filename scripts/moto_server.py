"""moto's server for the local SQS endpoint, with two fixes of speed and none of behaviour.

moto 5.2 asks "is this message visible / delayed" by building two datetimes per question,
and asks it of every message a queue holds several times per request: ReceiveMessage
checks each message it returns against the retention period by computing every queue
attribute (the approximate counts are passes over all messages), and a FIFO queue's
SendMessage computes them all too to read one flag. A queue of 1,000 messages then
costs over half a second per request, and draining it half a minute. The fixes:

- `Message.visible` / `Message.delayed` compare with the clock read once, as a float of
  milliseconds since the epoch (what moto's `unix_time_millis` computes, the slow way);
- the retention check reads the queue's retention period directly (the same value).

Run with the virtualenv's Python that scripts/services.sh makes, with moto_server's
arguments: `python3 scripts/moto_server.py -H 127.0.0.1 -p 4566`.
"""

import sys
import time

from moto.server import main
from moto.sqs import models


def now_millis():
    return time.time() * 1000.0


models.Message.visible = property(lambda self: now_millis() > self.visible_at)
models.Message.delayed = property(lambda self: now_millis() < self.delayed_until)


def is_message_valid_based_on_retention_period(self, queue_name, message):
    retention_period = self.get_queue(queue_name).message_retention_period
    return retention_period + message.sent_timestamp / 1000 > time.time()


models.SQSBackend.is_message_valid_based_on_retention_period = (
    is_message_valid_based_on_retention_period
)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
