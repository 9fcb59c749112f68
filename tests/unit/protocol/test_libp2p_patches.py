"""protocol/transports/libp2p/patches.py: the version check and the patches that need no network."""
import pytest

pytest.importorskip("libp2p")

import trio  # noqa: E402

from protocol.transports.libp2p import patches  # noqa: E402


def test_version_check_names_the_patched_and_the_installed_version():
    assert patches.libp2p_version_problem(patches.PATCHED_LIBP2P_VERSION) is None
    problem = patches.libp2p_version_problem("0.9.0")
    assert "0.8.1" in problem and "0.9.0" in problem and "libp2p==0.8.1" in problem
    assert "tests/test_protocol_libp2p.py" in problem  # what to do
    assert "no libp2p distribution" in patches.libp2p_version_problem(None)


def test_installed_libp2p_is_the_patched_version():
    from importlib.metadata import version

    assert version("libp2p") == patches.PATCHED_LIBP2P_VERSION, patches.libp2p_version_problem(version("libp2p"))


def test_eclipse_protection_is_off_only_for_local_swarms():
    assert not patches.eclipse_protection_for(["/ip4/127.0.0.1/tcp/0"])
    assert not patches.eclipse_protection_for(["/ip4/0.0.0.0/tcp/0", "/ip6/::1/tcp/5"])
    assert patches.eclipse_protection_for(["/ip4/0.0.0.0/tcp/0", "/ip4/10.0.0.5/tcp/4001"])
    assert patches.eclipse_protection_for(["not a multiaddr"])


def test_shutdown_noise_is_told_apart_from_real_errors():
    noise = BaseExceptionGroup("x", [RuntimeError("Nursery is closed to new arrivals")])
    assert patches.is_shutdown_noise(noise)
    assert not patches.is_shutdown_noise(BaseExceptionGroup("x", [noise.exceptions[0], ValueError("boom")]))
    assert not patches.is_shutdown_noise(RuntimeError("something else"))

    async def cancelled() -> BaseException:
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.sleep(1)
            except trio.Cancelled as e:
                return e
        raise AssertionError("not cancelled")

    assert patches.is_shutdown_noise(trio.run(cancelled))


def test_equivocation_cache_is_trimmed_to_the_newest():
    class Router:
        equivocation_detection = {k: b"x" for k in range(300)}

    patches.trim_equivocation_cache(Router, keep=128, above=256)
    assert list(Router.equivocation_detection) == list(range(172, 300))
