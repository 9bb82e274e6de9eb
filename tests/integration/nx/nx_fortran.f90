! tests/integration/nx/nx_fortran.f90: NX from Fortran (include 'fnx.h'):
! point to point, probes, asynchronous receives, a handler, reductions,
! gcolx and the message information, checked for their values. Built twice
! (gfortran's underscore names against libvmmc_nx, -fno-underscoring
! against libvmmc_nx_fortran_plain) and run by test_nx.cc under nxrun and
! mpirun on 2 or more nodes. A failed check ends with status 3.
module handled
  implicit none
  integer :: htype = -1, hcount = -1, hnode = -1
contains
  subroutine on_message(type, count, node, ptype)
    integer, intent(in) :: type, count, node, ptype
    htype = type
    hcount = count
    hnode = node
  end subroutine
end module

program nx_fortran
  use handled
  implicit none
  include 'fnx.h'
  integer :: me, n, j, mid, mid2, i, total, was
  logical :: handled_it
  integer :: ibuf(10), info(8), lens(64), counts(3), bits(1)
  double precision :: d(2), dsum(1)
  real :: s(1)
  character(len=64) :: text, joined

  me = mynode()
  n = numnodes()
  call check(n >= 2, 'at least 2 nodes')

  ! Point to point, probes and the message information.
  if (me == 0) then
    ibuf = [(i * 3, i = 1, 10)]
    call csend(100, ibuf, 40, 1, 0)
  else if (me == 1) then
    call cprobe(100)
    call check(infocount() == 40 .and. infonode() == 0 .and. infotype() == 100, 'cprobe info')
    call check(iprobex(-1, 0, -1, info) == 1 .and. info(NX_INFO_COUNT) == 40, 'iprobex')
    call check(iprobex(100, 0, 7, info) == 0, 'iprobex ptype 7')
    ibuf = 0
    call crecv(100, ibuf, 40)
    call check(all(ibuf == [(i * 3, i = 1, 10)]), 'crecv values')
    call check(infocount() == 40 .and. infoptype() == 0, 'crecv info')
    call check(iprobe(100) == 0, 'nothing left')
  end if
  call gsync()

  ! Every other node to node 0, taken by node in reverse order (crecvx).
  if (me /= 0) then
    ibuf(1) = me * 10
    call csend(102, ibuf, 4, 0, 0)
  else
    do j = n - 1, 1, -1
      ibuf(1) = -1
      call crecvx(102, ibuf, 4, j, -1, info)
      call check(ibuf(1) == j * 10, 'crecvx value')
      call check(info(NX_INFO_NODE) == j .and. info(NX_INFO_COUNT) == 4, 'crecvx info')
      call check(info(NX_INFO_TYPE) == 102 .and. infonode() == j, 'crecvx msginfo')
    end do
  end if
  call gsync()

  ! Asynchronous: irecvx's info, msgdone, msgmerge, and a handler (hrecv).
  if (me == 0) then
    d = [1.5d0, -2.25d0]
    mid = isend(103, d, 16, 1, 0)
    call msgwait(mid)
    mid = isend(104, d, 8, 1, 0)
    do while (msgdone(mid) == 0)
    end do
    text = 'hello, node 1'
    call csend(105, text, 13, 1, 0)
  else if (me == 1) then
    d = 0
    info = 0
    mid = irecvx(103, d, 16, 0, -1, info)
    mid2 = irecv(104, dsum, 8)
    mid = msgmerge(mid, mid2)
    call msgwait(mid)
    call check(d(1) == 1.5d0 .and. d(2) == -2.25d0 .and. dsum(1) == 1.5d0, 'irecv values')
    call check(info(NX_INFO_COUNT) == 16 .and. info(NX_INFO_TYPE) == 103, 'irecvx info')
    text = ' '
    mid = hrecv(105, text, 64, on_message)
    ! The handler may run on the library's thread: read what it writes
    ! with the trap masked.
    do i = 1, 10000000
      was = masktrap(1)
      handled_it = htype == 105
      was = masktrap(was)
      if (handled_it) exit
      call flick()
    end do
    call check(htype == 105 .and. hcount == 13 .and. hnode == 0, 'handler arguments')
    call check(text(1:13) == 'hello, node 1', 'handler buffer')
  end if
  call gsync()

  ! Reductions, checked against the serial result.
  dsum(1) = me + 1
  call gdsum(dsum, 1, d)
  call check(dsum(1) == n * (n + 1) / 2, 'gdsum')
  s(1) = 0.5 * me
  call gssum(s, 1, s)
  call check(abs(s(1) - 0.25 * n * (n - 1)) < 1e-5, 'gssum')
  counts = [me, 1, -me]
  call gisum(counts, 3, ibuf)
  call check(counts(1) == n * (n - 1) / 2 .and. counts(2) == n .and. &
             counts(3) == -n * (n - 1) / 2, 'gisum')
  counts = [me, me, me]
  call gihigh(counts, 3, ibuf)
  call check(all(counts == n - 1), 'gihigh')
  counts(1) = me + 7
  call gilow(counts, 1, ibuf)
  call check(counts(1) == 7, 'gilow')
  bits(1) = ishft(1, me)
  call gior(bits, 1, ibuf)
  call check(bits(1) == ishft(1, n) - 1, 'gior')
  d(1) = 2d0
  call gdprod(d, 1, dsum)
  call check(d(1) == 2d0 ** n, 'gdprod')

  ! gcolx: node j contributes j+1 characters 'a'+j.
  do j = 0, n - 1
    lens(j + 1) = j + 1
  end do
  text = repeat(achar(iachar('a') + me), me + 1)
  joined = ' '
  call gcolx(text, lens, joined)
  total = 0
  do j = 0, n - 1
    call check(joined(total + 1:total + j + 1) == repeat(achar(iachar('a') + j), j + 1), 'gcolx')
    total = total + j + 1
  end do

  call check(myhost() == n .and. mypid() == myptype() .and. ginv(gray(9)) == 9, 'environment')
  call check(dclock() > 0d0, 'dclock')
  call check(nx_initve(' ', 0, ' ') == n .and. nx_initve_rect(' ', 0, 1, n, ' ') == n, 'nx_initve')
  call check(mypart(counts(1), counts(2)) == 0 .and. counts(1) * counts(2) == n, 'mypart')
  call gsync()
  if (me == 0) print '(a, i0, a)', 'nx_fortran: ', n, ' nodes ok'

contains

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (.not. ok) then
      write (0, '(a, i0, 2a)') 'node ', mynode(), ': check failed: ', what
      error stop 3
    end if
  end subroutine

end program
