"""leases, retries, cancel, schedules

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('schedules',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('manifest', sa.Text(), nullable=False),
    sa.Column('cron', sa.String(length=128), nullable=False),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_schedules')),
    sa.UniqueConstraint('name', name=op.f('uq_schedules_name'))
    )
    op.create_table('schedule_firings',
    sa.Column('schedule_id', sa.Integer(), nullable=False),
    sa.Column('fire_time', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('errors', sa.Text(), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_schedule_firings_run_id_runs'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['schedule_id'], ['schedules.id'], name=op.f('fk_schedule_firings_schedule_id_schedules'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_schedule_firings')),
    sa.UniqueConstraint('schedule_id', 'fire_time', name=op.f('uq_schedule_firings_schedule_id_fire_time'))
    )
    with op.batch_alter_table('schedule_firings', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_schedule_firings_schedule_id'), ['schedule_id'], unique=False)

    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cancelled_at', sa.DateTime(timezone=True), nullable=True))

    with op.batch_alter_table('videos', schema=None) as batch_op:
        batch_op.add_column(sa.Column('upload_sha256', sa.String(length=64), nullable=True))

    with op.batch_alter_table('work_units', schema=None) as batch_op:
        batch_op.add_column(sa.Column('rank', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('not_before', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('solo', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column('last_error', sa.Text(), nullable=True))
        batch_op.drop_index(batch_op.f('ix_work_units_claim'))
        batch_op.create_index('ix_work_units_claim', ['status', 'rank'], unique=False)

    # Rank existing units as new ones are ranked (jobs.db.submission.unit_rank: priority x 600 s minus submission time).
    units = sa.table('work_units', sa.column('id'), sa.column('priority'),
                     sa.column('created_at', sa.DateTime(timezone=True)), sa.column('rank', sa.BigInteger()))
    conn = op.get_bind()
    for unit_id, priority, created in conn.execute(sa.select(units.c.id, units.c.priority, units.c.created_at)):
        epoch = int(created.timestamp())
        conn.execute(units.update().where(units.c.id == unit_id).values(rank=priority * 600 - epoch))


def downgrade() -> None:
    with op.batch_alter_table('work_units', schema=None) as batch_op:
        batch_op.drop_index('ix_work_units_claim')
        batch_op.create_index(batch_op.f('ix_work_units_claim'), ['status', 'priority', 'id'], unique=False)
        batch_op.drop_column('last_error')
        batch_op.drop_column('solo')
        batch_op.drop_column('not_before')
        batch_op.drop_column('rank')

    with op.batch_alter_table('videos', schema=None) as batch_op:
        batch_op.drop_column('upload_sha256')

    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('cancelled_at')

    with op.batch_alter_table('schedule_firings', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_schedule_firings_schedule_id'))

    op.drop_table('schedule_firings')
    op.drop_table('schedules')
