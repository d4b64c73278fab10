/* A stand-in for Windows' bcryptprimitives.dll, which Wine 8 (Debian 12) lacks.
 *
 * Rust's standard library on Windows takes its random numbers (HashMap seeds) from
 * ProcessPrng in bcryptprimitives.dll; without the DLL no Rust program starts under that Wine.
 * This one forwards to RtlGenRandom (advapi32's SystemFunction036), which Wine has. It is
 * only ever installed into the test Wine prefix, never shipped. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG chunk = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
