/* Ctrl-C for runs in C. Python's SIGINT handler only notes the signal; its Python part runs when
 * the main thread next evaluates bytecode, which a compiled loop running in C (with the GIL
 * released, or held by an eager loop) never does. So kiln puts a C handler in front of Python's:
 * it calls Python's, then requests an interrupt (kiln_interrupt, async-signal-safe), which the
 * executors see between kernels and loop iterations. An interrupted run raises what Python's
 * handler raises (KeyboardInterrupt by default; KeyboardInterrupt when the handler raises
 * nothing). As Python delivers KeyboardInterrupt to the main thread only, only the main thread's
 * runs stop.
 *
 * Python code may replace the handler (signal.signal): kiln's goes back in front of the new one
 * before each run that may take long (pykiln_interrupt_arm), unless SIGINT is ignored or left to
 * its default action. A request whose signal Python handled outside a kiln run (Ctrl-C in Python
 * code) is stale: the main thread clears it before its next run (pykiln_interrupt_settle). */
#include <errno.h>
#include <signal.h>

#include "pykiln.h"

static struct sigaction chained; /* the handler kiln's calls first (Python's) */
static unsigned long main_ident;

static void on_sigint(int sig, siginfo_t *info, void *context) {
    int saved = errno;
    /* Python's first: when an executor sees the request, Python's signal is already pending */
    if (chained.sa_flags & SA_SIGINFO) chained.sa_sigaction(sig, info, context);
    else if (chained.sa_handler != SIG_DFL && chained.sa_handler != SIG_IGN) chained.sa_handler(sig);
    kiln_interrupt();
    errno = saved;
}

void pykiln_interrupt_arm(void) {
    struct sigaction cur;
    if (sigaction(SIGINT, NULL, &cur) != 0) return;
    if (cur.sa_flags & SA_SIGINFO) {
        if (cur.sa_sigaction == on_sigint) return;
    } else if (cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN) {
        return; /* Ctrl-C ends the process, or is ignored: nothing to add */
    }
    chained = cur; /* kiln's handler is not installed now: nothing reads this meanwhile */
    struct sigaction act = cur;
    act.sa_sigaction = on_sigint;
    act.sa_flags = cur.sa_flags | SA_SIGINFO;
    sigaction(SIGINT, &act, NULL);
}

int pykiln_interrupt_settle(void) {
    if (PyThread_get_thread_ident() != main_ident) return 0;
    kiln_interrupt_clear();
    return PyErr_CheckSignals();
}

PyObject *pykiln_raise_interrupted(void) {
    kiln_interrupt_clear();
    if (PyErr_CheckSignals() < 0) return NULL;
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    return NULL;
}

int pykiln_interrupt_init(void) {
    PyObject *threading = PyImport_ImportModule("threading");
    PyObject *main = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
    PyObject *ident = main ? PyObject_GetAttrString(main, "ident") : NULL;
    Py_XDECREF(threading);
    Py_XDECREF(main);
    if (!ident) return -1;
    main_ident = PyLong_AsUnsignedLong(ident);
    Py_DECREF(ident);
    if (PyErr_Occurred()) return -1;
    kiln_interrupt_only_thread((uint64_t)main_ident);
    pykiln_interrupt_arm();
    return 0;
}
