//! Zero-copy interop: a `Vec` handed to `from_vec` becomes the tensor's buffer, and
//! `as_slice` borrows a realized tensor's memory under a guard that blocks in-place updates.

use kiln::{DType, KilnError, Tensor};

#[test]
fn from_vec_adopts_the_vector_without_copying() {
    let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let ptr = data.as_ptr();
    let x = Tensor::from_vec(data, [10, 100]);
    let s = x.as_slice::<f32>().unwrap();
    assert_eq!(s.as_ptr(), ptr, "the tensor reads the vector's own memory");
    assert_eq!(s[999], 999.0);
    drop(s);
    // In-place updates write into that same memory.
    x.add_(1.0);
    x.realize().unwrap();
    let s = x.as_slice::<f32>().unwrap();
    assert_eq!((s.as_ptr(), s[0], s[999]), (ptr, 1.0, 1000.0));
    // Every element type adopts; bools and half types included.
    let b = Tensor::from_vec(vec![true, false], [2]);
    assert_eq!(b.to_vec::<bool>().unwrap(), vec![true, false]);
    let h = Tensor::from_vec(vec![kiln::f16::from_f32(1.5); 3], [3]);
    assert_eq!(
        (h.dtype(), h.to_vec::<f32>().unwrap()),
        (DType::F16, vec![1.5; 3])
    );
    let e = Tensor::from_vec(Vec::<i64>::new(), [0, 4]);
    assert_eq!(e.as_slice::<i64>().unwrap().len(), 0);
}

#[test]
fn adopted_memory_is_freed_with_its_last_reader() {
    let x = Tensor::from_vec(vec![2.0f64; 64], [64]);
    let y = (&x * 3.0).sum(..);
    drop(x);
    // The lazy result still reads the adopted vector.
    assert_eq!(y.item::<f64>().unwrap(), 384.0);
}

#[test]
fn a_borrowed_buffer_refuses_in_place_updates() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    let s = x.as_slice::<f32>().unwrap();
    let e = x.try_add_(1.0).unwrap_err();
    assert!(matches!(e, KilnError::Borrowed { op: "add_", .. }), "{e}");
    assert!(e.to_string().contains("[2] f32"), "{e}");
    // Reading is fine while borrowed.
    assert_eq!((&x * 2.0).to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    drop(s);
    x.add_(1.0);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
}

#[test]
fn an_update_recorded_before_the_borrow_fails_when_it_would_run() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    // `detach` shares the realized buffer; borrowing it pins that memory.
    let d = x.detach();
    x.mul_(10.0); // recorded, not yet run
    let s = d.as_slice::<f32>().unwrap();
    let e = x.realize().unwrap_err();
    assert!(
        matches!(e, KilnError::Borrowed { op: "realize", .. }),
        "{e}"
    );
    assert_eq!(&*s, &[1.0, 2.0], "the refused program wrote nothing");
    drop(s);
    x.realize().unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![10.0, 20.0]);
}

#[test]
fn as_slice_realizes_views_and_checks_the_element_type() {
    let x = Tensor::arange(0.0, 6.0, 1.0).reshape([2, 3]);
    let t = x.t();
    assert_eq!(
        &*t.as_slice::<f32>().unwrap(),
        &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    let e = x.as_slice::<f64>().unwrap_err();
    assert!(
        matches!(e, KilnError::DTypeMismatch { op: "as_slice", .. }),
        "{e}"
    );
    // The guard keeps the memory alive after the tensor is gone.
    let s = {
        let y = Tensor::from_vec(vec![7u8, 8, 9], [3]);
        y.as_slice::<u8>().unwrap()
    };
    assert_eq!(&*s, &[7, 8, 9]);
}
