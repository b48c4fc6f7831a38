// health.verdict, the server's one answer to "which rank stopped", as every
// page says it: its sentence first, then the named rank's stack and how it
// was reached. Pages mark the cells and rows of verdict.ranks.

/** The verdict /ranks sent with the ranks, else the job's health.verdict (null when none). */
export function verdictOf(job, ranksAnswer) {
  return (ranksAnswer && ranksAnswer.verdict) || ((job && job.health) || {}).verdict || null;
}

/** How verdict.ranks are marked: 'named', or 'tied' when silence cannot tell them apart. */
export function markOf(verdict) {
  return verdict.rank == null ? 'tied' : 'named';
}

/** The verdict as [kind, text] lines: 'verdict' (the sentence), 'stack', 'how'. */
export function verdictLines(verdict) {
  return [
    ['verdict', verdict.text],
    verdict.stack ? ['stack', `Stack: ${verdict.stack}`] : null,
    ['how', `by ${verdict.by}, confidence ${verdict.confidence}`],
  ].filter(Boolean);
}

/** One entry of a rank_stopped event's stacks: "rank 3: train.py:88 in forward → time.sleep(3600)". */
export function stackLine(stack) {
  return `rank ${stack.rank}: ${stack.where || '?'}`;
}

export function shorten(text, n) {
  return text.length <= n ? text : `${text.slice(0, n - 1).trimEnd()}…`;
}
