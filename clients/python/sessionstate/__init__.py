"""sessionstate for Python: the generated messages and gRPC stubs (``sessionstate.v1``, made
by ``clients/python/generate.sh`` from ``proto/``), a reconnecting notice stream for threaded
code (``sessionstate.notices.NoticeStream``) and asyncio helpers for notices and the inbox
(``sessionstate.aio``).

The helpers log through the standard ``logging`` module, under the ``sessionstate`` logger,
and say nothing until the application configures logging (``logging.basicConfig()``)."""

import logging

from sessionstate.aio import AsyncInboxStream, AsyncNoticeStream
from sessionstate.notices import Backoff, NoticeStream, bearer_metadata

__version__ = "0.1.0"

# A library stays quiet unless the application asks: without a handler of its own, logging
# would print warnings on stderr.
logging.getLogger("sessionstate").addHandler(logging.NullHandler())

__all__ = ["AsyncInboxStream", "AsyncNoticeStream", "Backoff", "NoticeStream", "bearer_metadata", "__version__"]
