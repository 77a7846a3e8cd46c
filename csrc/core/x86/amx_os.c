/*
 * amx_os.c — ask Linux for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM
 * for XTILEDATA, kernel 5.16+): until a process has it, the first tile
 * instruction kills it with SIGILL.  Its own file because syscall() needs
 * _GNU_SOURCE.  Called once by dispatch.c, only where CPUID shows AMX.
 */
#define _GNU_SOURCE
#include "internal.h"

#if FP8MIX_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int fp8mix_amx_request(void)
{
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0; /* refused */
    unsigned long bits = 0;
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits) == 0 && (bits >> XFEATURE_XTILEDATA & 1u);
}
#else
int fp8mix_amx_request(void) { return 0; } /* no way to ask: no AMX */
#endif
