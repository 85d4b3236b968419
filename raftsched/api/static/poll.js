// Re-run `load` every `every_ms` until the returned stop function is called
// (a view stops its polls when the operator leaves it). A failed load shows
// its error through `onError` and the poll goes on: the cluster may be
// electing a leader.

export function poll(load, every_ms, onError) {
  let stopped = false;
  let timer = null;
  async function tick() {
    try {
      await load();
    } catch (err) {
      if (onError) onError(err);
    }
    if (!stopped) timer = setTimeout(tick, every_ms);
  }
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
