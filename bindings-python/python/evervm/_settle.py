"""Completes an asyncio future from evervm's runtime (scheduled with call_soon_threadsafe)."""

import asyncio
from typing import Any, Optional


def settle(future: "asyncio.Future[Any]", value: Any, error: Optional[BaseException]) -> None:
    if future.done():  # cancelled by its awaiter meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
