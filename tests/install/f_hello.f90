! tests/install/f_hello.f90: a Fortran program built with the installed nxf77,
! calling libvmmc_nx through C bindings until NX's own Fortran entry points
! land; started alone it is node 0 of 1.
program hello
  use iso_c_binding
  interface
    function mynode() bind(c, name='mynode')
      import c_long
      integer(c_long) :: mynode
    end function
    function numnodes() bind(c, name='numnodes')
      import c_long
      integer(c_long) :: numnodes
    end function
  end interface
  print '(a,i0,a,i0)', 'fortran node ', mynode(), ' of ', numnodes()
end program
