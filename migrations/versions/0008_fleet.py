"""fleets of unlike machines: each work unit's model, claim indexes by model and by shape, the models a worker
session serves, and a run's videos by status

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('work_units') as batch:
        batch.add_column(sa.Column('model', sa.String(length=128), nullable=True))
    # Every unit so far belongs to its run's model.
    op.execute("UPDATE work_units SET model = (SELECT runs.model FROM videos JOIN runs ON runs.id = videos.run_id "
               "WHERE videos.id = work_units.video_id)")
    with op.batch_alter_table('work_units') as batch:
        batch.alter_column('model', existing_type=sa.String(length=128), nullable=False)
        batch.drop_index('ix_work_units_claim')
        batch.drop_index(batch.f('ix_work_units_shape_key'))
    # Outside the batch: SQLite's batch mode copies the table and cannot re-create an index on an expression.
    op.create_index('ix_work_units_claim_model', 'work_units', ['status', 'ready', 'model', sa.text('rank DESC'), 'id'])
    op.create_index('ix_work_units_claim_shape', 'work_units',
                    ['status', 'ready', 'shape_key', sa.text('rank DESC'), 'id'])
    op.create_index('ix_videos_run_id_status', 'videos', ['run_id', 'status'])
    with op.batch_alter_table('worker_sessions') as batch:
        batch.add_column(sa.Column('models', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('worker_sessions') as batch:
        batch.drop_column('models')
    op.drop_index('ix_videos_run_id_status', table_name='videos')
    op.drop_index('ix_work_units_claim_shape', table_name='work_units')
    op.drop_index('ix_work_units_claim_model', table_name='work_units')
    with op.batch_alter_table('work_units') as batch:
        batch.create_index(batch.f('ix_work_units_shape_key'), ['shape_key'], unique=False)
        batch.create_index('ix_work_units_claim', ['status', 'rank'], unique=False)
        batch.drop_column('model')
