/*
 * threadpool.h - a fixed set of worker threads created at start-up that run
 * parallel-for loops. Workers spin briefly between loops (a decode step issues
 * hundreds of short loops) and then sleep on a condition variable.
 * Tasks are handed out dynamically; which thread runs a task never changes
 * its result (callers must not reduce across tasks in a thread-dependent way).
 */
#ifndef SAMPLER_THREADPOOL_H
#define SAMPLER_THREADPOOL_H

typedef struct ThreadPool ThreadPool;
/* fn(ctx, task, thread): thread in [0, n_threads) indexes per-thread scratch. */
typedef void (*TaskFn)(void *ctx, int task, int thread);

ThreadPool *threadpool_create(int n_threads); /* n_threads includes the caller */
void threadpool_free(ThreadPool *tp);
/* Runs fn for task in [0, n_tasks) and returns when all are done. Not reentrant. */
void threadpool_run(ThreadPool *tp, int n_tasks, TaskFn fn, void *ctx);

#endif
