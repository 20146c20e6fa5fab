"""Fixtures that more than one test module uses."""

import pytest
from malcolm.net.transport import open_transport
from test_transport import PARAMS, _addr


@pytest.fixture(params=PARAMS)
def pair(request):
    """Two endpoints of one transport, for every transport the suite runs (verbs only under
    ``-m rdma``, in the Soft-RoCE guest): the transport suite and the delay stage's tests."""
    kind = request.param
    a = open_transport(kind, _addr(kind))
    b = open_transport(kind, _addr(kind))
    yield kind, a, b
    a.close()
    b.close()
