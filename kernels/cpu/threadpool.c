/*
 * threadpool.c - spin-then-sleep parallel-for pool (see threadpool.h).
 */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "check.h"

#define SPIN_ITERS 20000 /* ~100 us of spinning before a worker sleeps */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    sched_yield();
#endif
}

struct ThreadPool {
    int n;                 /* threads including the caller */
    pthread_t *th;         /* [n - 1] */
    atomic_uint gen;       /* bumped once per run */
    atomic_int next;       /* next task to hand out */
    atomic_int done;       /* workers finished with this gen */
    atomic_int stop;
    int n_tasks;
    TaskFn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct { ThreadPool *tp; int id; } WorkerArg;

static void run_tasks(ThreadPool *tp, int id) {
    int i;
    while ((i = atomic_fetch_add(&tp->next, 1)) < tp->n_tasks) tp->fn(tp->ctx, i, id);
}

static void *worker(void *p) {
    WorkerArg a = *(WorkerArg *)p;
    free(p);
    ThreadPool *tp = a.tp;
    unsigned seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load(&tp->gen) == seen && !atomic_load(&tp->stop)) {
            if (++spins < SPIN_ITERS) { cpu_relax(); continue; }
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->gen) == seen && !atomic_load(&tp->stop)) pthread_cond_wait(&tp->cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) return NULL;
        seen = atomic_load(&tp->gen);
        run_tasks(tp, a.id);
        atomic_fetch_add(&tp->done, 1);
    }
}

ThreadPool *threadpool_create(int n_threads) {
    ThreadPool *tp = xcalloc(1, sizeof *tp);
    tp->n = n_threads < 1 ? 1 : n_threads;
    tp->th = xcalloc((size_t)tp->n, sizeof(pthread_t));
    CHECK(pthread_mutex_init(&tp->mu, NULL) == 0, "pthread_mutex_init");
    CHECK(pthread_cond_init(&tp->cv, NULL) == 0, "pthread_cond_init");
    for (int i = 1; i < tp->n; i++) {
        WorkerArg *a = xmalloc(sizeof *a);
        *a = (WorkerArg){tp, i};
        CHECK(pthread_create(&tp->th[i - 1], NULL, worker, a) == 0, "cannot start worker thread %d", i);
    }
    return tp;
}

void threadpool_free(ThreadPool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->th[i - 1], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp->th);
    free(tp);
}

void threadpool_run(ThreadPool *tp, int n_tasks, TaskFn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (tp->n == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n_tasks = n_tasks;
    atomic_store(&tp->next, 0);
    atomic_store(&tp->done, 0);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add(&tp->gen, 1);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    run_tasks(tp, 0);
    /* A preempted worker may still hold a task: yield rather than burn the core it needs. */
    for (int spins = 0; atomic_load(&tp->done) < tp->n - 1; spins++) {
        if (spins < 1000) cpu_relax();
        else sched_yield();
    }
}
