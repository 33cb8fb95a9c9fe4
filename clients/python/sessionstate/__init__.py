"""sessionstate for Python: the generated messages and gRPC stubs (``sessionstate.v1``, made
by ``clients/python/generate.sh`` from ``proto/``) and a resilient notice stream
(``sessionstate.notices.NoticeStream``)."""

from sessionstate.notices import Backoff, NoticeStream, bearer_metadata

__all__ = ["Backoff", "NoticeStream", "bearer_metadata"]
